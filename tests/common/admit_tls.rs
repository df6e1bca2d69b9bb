//! `shmlink admit`'s other side: a test CA that signs server certificates, a Kubernetes Secret
//! volume's layout on disk (files behind the `..data` symlink, swapped whole), and an HTTPS
//! client (HTTP/1.1 or HTTP/2 by ALPN) that trusts only that CA. Used by tests/e2e_containers/admit.rs and
//! bench/admission (each includes it by path).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A CA made for one test.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A server certificate the CA signed, and its key.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "shmlink test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// A certificate for the webhook's Service names and 127.0.0.1, valid until `not_after`
    /// (year, month, day).
    pub fn leaf(&self, not_after: (i32, u8, u8)) -> Leaf {
        let mut params = CertificateParams::new(vec![
            "shmlink-admission.shmlink.svc".to_string(),
            "127.0.0.1".to_string(),
        ])
        .unwrap();
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// A directory laid out as the kubelet writes a Secret volume: `tls.crt` and `tls.key` are
/// symlinks through `..data`, which points at a timestamped directory; an update writes a new
/// directory and renames a new `..data` over the old one (one atomic step).
pub struct SecretVolume {
    pub dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    pub fn new(dir: &Path, cert_pem: &str, key_pem: &str) -> SecretVolume {
        let mut volume = SecretVolume {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        volume.update(cert_pem, key_pem);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
        volume
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    /// The kubelet's update: new files in a new directory, then `..data` swapped.
    pub fn update(&mut self, cert_pem: &str, key_pem: &str) {
        self.generation += 1;
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let name = format!("..2026_11_27_10_00_00.{}", self.generation);
        let fresh = self.dir.join(&name);
        std::fs::create_dir(&fresh).unwrap();
        std::fs::write(fresh.join("tls.crt"), cert_pem).unwrap();
        std::fs::write(fresh.join("tls.key"), key_pem).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http {
    One,
    Two,
}

impl Http {
    fn alpn(self) -> &'static [u8] {
        match self {
            Http::One => b"http/1.1",
            Http::Two => b"h2",
        }
    }
}

/// The client's TLS: trusts `ca_pem` only, offers one protocol.
pub fn connector(ca_pem: &str, http: Http) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![http.alpn().to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection to `addr` as the API server makes it (the Service's name is checked).
pub async fn tls_connect(
    addr: SocketAddr,
    connector: &TlsConnector,
) -> std::io::Result<TlsStream<TcpStream>> {
    tls_connect_from(None, addr, connector).await
}

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.x: another client as
/// the server counts them), or from wherever the system picks.
pub async fn tcp_from(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
) -> std::io::Result<TcpStream> {
    let Some(ip) = from else {
        return TcpStream::connect(addr).await;
    };
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(addr).await
}

/// [`tls_connect`] from the loopback address `from`.
pub async fn tls_connect_from(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
    connector: &TlsConnector,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = tcp_from(from, addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("shmlink-admission.shmlink.svc").unwrap();
    connector.connect(name, tcp).await
}

/// The certificate a new connection is served (its DER).
pub async fn served_cert(addr: SocketAddr, ca_pem: &str) -> std::io::Result<Vec<u8>> {
    let tls = tls_connect(addr, &connector(ca_pem, Http::One)).await?;
    let chain = tls.get_ref().1.peer_certificates().unwrap_or_default();
    Ok(chain
        .first()
        .map(|c: &CertificateDer| c.to_vec())
        .unwrap_or_default())
}

/// One keep-alive connection.
pub enum Client {
    One(http1::SendRequest<Full<Bytes>>),
    Two(http2::SendRequest<Full<Bytes>>),
}

/// An answer: status, content type, body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Client {
    pub async fn connect(addr: SocketAddr, ca_pem: &str, http: Http) -> std::io::Result<Client> {
        Client::connect_from(None, addr, ca_pem, http).await
    }

    /// [`Client::connect`] from the loopback address `from`.
    pub async fn connect_from(
        from: Option<std::net::IpAddr>,
        addr: SocketAddr,
        ca_pem: &str,
        http: Http,
    ) -> std::io::Result<Client> {
        let tls = tls_connect_from(from, addr, &connector(ca_pem, http)).await?;
        let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        assert_eq!(negotiated.as_deref(), Some(http.alpn()), "ALPN");
        let io = TokioIo::new(tls);
        let broken = |e: hyper::Error| std::io::Error::other(e.to_string());
        Ok(match http {
            Http::One => {
                let (send, conn) = http1::handshake(io).await.map_err(broken)?;
                tokio::spawn(conn);
                Client::One(send)
            }
            Http::Two => {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(broken)?;
                tokio::spawn(conn);
                Client::Two(send)
            }
        })
    }

    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Reply, hyper::Error> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("https://shmlink-admission.shmlink.svc{path}"))
            .header("content-type", "application/json")
            .body(Full::new(body.into()))
            .unwrap();
        let response = match self {
            Client::One(send) => {
                send.ready().await?;
                send.send_request(request).await?
            }
            Client::Two(send) => {
                send.ready().await?;
                send.send_request(request).await?
            }
        };
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = response.into_body().collect().await?.to_bytes().to_vec();
        Ok(Reply {
            status,
            content_type,
            body,
        })
    }
}
