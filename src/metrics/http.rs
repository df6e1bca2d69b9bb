//! The listeners' own series, in `serve`'s registry and in `admit`'s: connections a listener
//! refused or ended for what the client did, and requests it shed. Families with no series yet
//! are not written, so a server nobody attacked shows none.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why a listener let a connection go before the client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// Refused at accept: the client address already holds its share of connections.
    PerClient,
    /// Refused at accept: every connection and the probes' reserve are held.
    Full,
    /// Closed: no request (TLS handshake included) within the first request's deadline.
    NoRequest,
    /// Closed: one request (its answer written whole) took longer than the request deadline.
    RequestTimeout,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::PerClient => "per_client",
            Dropped::Full => "full",
            Dropped::NoRequest => "no_request",
            Dropped::RequestTimeout => "request_timeout",
        }
    }
}

/// Why a request was answered 503 without being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shed {
    /// A heavy answer (`/metrics`, `/api/v1/failures`) whose turn did not come in time.
    Busy,
    /// Not a probe, on a connection of the probes' reserve.
    Reserve,
}

impl Shed {
    pub fn as_str(self) -> &'static str {
        match self {
            Shed::Busy => "busy",
            Shed::Reserve => "reserve",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Handles on the two families; clones count into the same series.
#[derive(Debug, Clone, Default)]
pub struct HttpMetrics {
    dropped: Family<ReasonLabel, Counter>,
    shed: Family<ReasonLabel, Counter>,
}

impl HttpMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "shmlink_http_connections_dropped",
            "Connections refused at accept or closed by the server for what the client did, by \
             reason (per_client, full, no_request, request_timeout)",
            self.dropped.clone(),
        );
        registry.register(
            "shmlink_http_requests_shed",
            "Requests answered 503 unserved, by reason (busy: a heavy answer's turn did not \
             come in time; reserve: not a probe, on a connection of the probes' reserve)",
            self.shed.clone(),
        );
    }

    /// Counts one; the count so far (to log the first and every 1,000th).
    pub fn dropped(&self, why: Dropped) -> u64 {
        let c = self.dropped.get_or_create(&ReasonLabel {
            reason: why.as_str(),
        });
        c.inc() + 1
    }

    pub fn shed(&self, why: Shed) -> u64 {
        let c = self.shed.get_or_create(&ReasonLabel {
            reason: why.as_str(),
        });
        c.inc() + 1
    }
}
