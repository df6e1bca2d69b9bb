//! `GET /api/v1/failures?since=1h&namespace=NS&pod=NAME`: the stored history as `history
//! --json` prints it, written as it is read: one page of rows at a time, each read on a
//! blocking thread (SQLite's reads are file I/O), the next only once the connection has taken
//! the last. At most [`FAILURES_LIMIT`] rows of each kind, two readings at once, one per client.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Extension, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::heavy::{Turn, PIECE};
use super::listen::Client;
use super::{busy, client_of, Served};
use crate::state::pages::Pages;
use crate::state::Filter;

/// The rows of each kind answered at most (the newest): a bounded answer.
pub const FAILURES_LIMIT: usize = 1000;

/// One piece of the answer: this many rows at most, and no more once their JSON passes
/// [`PIECE`] bytes.
const PAGE_ROWS: usize = 128;

pub async fn failures(
    State(served): State<Arc<Served>>,
    client: Option<Extension<Client>>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(dir) = served.app.history.clone() else {
        return (
            StatusCode::NOT_FOUND,
            "no state store (serve --state-dir none)\n",
        )
            .into_response();
    };
    let filter = match failures_filter(query.as_deref().unwrap_or(""), SystemTime::now()) {
        Ok(f) => f,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let Some(turn) = served.reads.turn(client_of(client)).await else {
        return busy(&served);
    };
    let opened =
        tokio::task::spawn_blocking(move || crate::state::read_history_pages(&dir, &filter)).await;
    match opened {
        Ok(Ok(pages)) => (
            [(header::CONTENT_TYPE, "application/json")],
            streamed(pages, turn),
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "the read failed\n").into_response(),
    }
}

/// The answer's body: a page read (off the runtime) each time the connection asks for more.
/// A read that fails midway ends the body with an error (hyper then closes the connection,
/// so a client never takes a cut answer for a whole one).
fn streamed(pages: Pages, turn: Turn) -> Body {
    let pieces = futures::stream::unfold(Some((pages, turn)), |state| async move {
        let (mut pages, turn) = state?;
        let read = tokio::task::spawn_blocking(move || {
            let piece = pages.next_piece(PAGE_ROWS, PIECE);
            (pages, piece)
        })
        .await;
        match read {
            Ok((pages, Ok(Some(piece)))) => Some((Ok(Bytes::from(piece)), Some((pages, turn)))),
            Ok((_, Ok(None))) => None,
            Ok((_, Err(e))) => {
                tracing::warn!("reading the state store for /api/v1/failures: {e}");
                Some((Err(std::io::Error::other(e)), None))
            }
            Err(_) => Some((Err(std::io::Error::other("the read failed")), None)),
        }
    });
    Body::from_stream(pieces)
}

/// Pure: the query string's filter (`since` default 1h). Names are DNS labels, so an escaped
/// character is refused rather than decoded.
pub fn failures_filter(query: &str, now: SystemTime) -> Result<Filter, String> {
    let mut filter = Filter {
        since: now.checked_sub(Duration::from_secs(3600)),
        limit: FAILURES_LIMIT,
        ..Filter::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if value.contains(['%', '+']) {
            return Err(format!("{key}: escaped characters are not accepted\n"));
        }
        match key {
            "since" => {
                let d = humantime::parse_duration(value)
                    .map_err(|e| format!("since={value}: {e} (examples: 30m, 1h, 2d)\n"))?;
                filter.since = now.checked_sub(d);
            }
            "namespace" => filter.namespace = Some(value.to_string()),
            "pod" => filter.pod = Some(value.to_string()),
            _ => return Err(format!("unknown parameter {key} (since, namespace, pod)\n")),
        }
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failures_query_takes_since_namespace_and_pod_and_refuses_the_rest() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let f = failures_filter("", now).unwrap();
        assert_eq!(f.since, Some(now - Duration::from_secs(3600)));
        assert_eq!(f.limit, FAILURES_LIMIT);
        let f = failures_filter("since=2d&namespace=ml&pod=trainer-0", now).unwrap();
        assert_eq!(f.since, Some(now - Duration::from_secs(2 * 86400)));
        assert_eq!(f.namespace.as_deref(), Some("ml"));
        assert_eq!(f.pod.as_deref(), Some("trainer-0"));
        assert!(failures_filter("since=soon", now).is_err());
        assert!(failures_filter("pod=a%2Fb", now).is_err());
        assert!(failures_filter("limit=5", now).is_err());
    }
}
