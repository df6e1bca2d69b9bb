//! The webhook's certificate: read from two PEM files, served by a resolver whose pair can be
//! swapped while connections are open, and read again from disk every `--tls-reload-interval`.
//!
//! Files are compared by content, not by mtime or inode: a Kubernetes Secret volume replaces
//! its `..data` symlink atomically, so the paths stay the same and only what they read changes.
//! A pair that does not load (half written, a key of another certificate) leaves the one being
//! served in place; it is reported once per content, not once per check.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate and key could not be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in it")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {what}")]
    Pem { path: PathBuf, what: String },
    #[error("{path}: the certificate does not parse: {what}")]
    Certificate { path: PathBuf, what: String },
    #[error("{key} does not go with {cert}: {what}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        what: String,
    },
}

/// A certificate chain and its key, ready to serve, and the leaf's expiry.
#[derive(Clone)]
pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    /// The leaf certificate's notAfter, in seconds since the epoch.
    pub not_after: i64,
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The provider every TLS object here is built with: kube's own (ring), chosen explicitly so
/// nothing depends on a process-wide default being installed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Pure: PEM text of a chain (leaf first) and of its private key -> what to serve. The paths
/// only name the files in errors.
pub fn load_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<Loaded, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_path_buf(),
            what: e.to_string(),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    };
    let not_after = not_after(leaf).map_err(|what| TlsError::Certificate {
        path: cert_path.to_path_buf(),
        what,
    })?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key_path.to_path_buf(),
        what: format!("no private key: {e}"),
    })?;
    let key = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Mismatch {
        cert: cert_path.to_path_buf(),
        key: key_path.to_path_buf(),
        what: e.to_string(),
    })?;
    Ok(Loaded {
        key: Arc::new(key),
        not_after,
    })
}

/// The certificate's notAfter (x509-parser reads the DER).
fn not_after(cert: &CertificateDer<'_>) -> Result<i64, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|e| e.to_string())?;
    Ok(parsed.validity().not_after.timestamp())
}

/// Serves whatever pair was last stored: every handshake reads it, a swap affects only the
/// handshakes after it.
#[derive(Debug)]
pub struct Resolver {
    current: ArcSwap<CertifiedKey>,
}

impl Resolver {
    pub fn new(first: Arc<CertifiedKey>) -> Self {
        Resolver {
            current: ArcSwap::new(first),
        }
    }

    pub fn store(&self, key: Arc<CertifiedKey>) {
        self.current.store(key);
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The server's TLS configuration over `resolver`, offering HTTP/2 (the API server's choice
/// for webhooks) and HTTP/1.1.
pub fn server_config(resolver: Arc<Resolver>) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// What one look at the files came to.
#[derive(Debug)]
pub enum Reload {
    /// The same bytes as the last look (served, or already reported broken).
    Unchanged,
    /// A new pair, now served to new connections.
    Loaded(Loaded),
    /// New bytes that do not make a pair; the old one still serves.
    Broken(TlsError),
}

/// Reads the two files and tells what changed since the last look.
#[derive(Debug)]
pub struct Watcher {
    cert_path: PathBuf,
    key_path: PathBuf,
    /// The bytes of the last look, loaded or not: the same bytes are not judged twice.
    last: (Vec<u8>, Vec<u8>),
}

impl Watcher {
    /// Reads and loads the pair once (the start: any error is fatal there).
    pub fn start(cert_path: PathBuf, key_path: PathBuf) -> Result<(Watcher, Loaded), TlsError> {
        let files = read_both(&cert_path, &key_path)?;
        let loaded = load_pair(&files.0, &files.1, &cert_path, &key_path)?;
        let watcher = Watcher {
            cert_path,
            key_path,
            last: files,
        };
        Ok((watcher, loaded))
    }

    /// Blocking file reads: called off the async runtime.
    pub fn check(&mut self) -> Reload {
        let files = match read_both(&self.cert_path, &self.key_path) {
            Ok(files) => files,
            // A file gone for a moment: an error once, and again only when it comes back.
            Err(e) => {
                if self.last == (Vec::new(), Vec::new()) {
                    return Reload::Unchanged;
                }
                self.last = (Vec::new(), Vec::new());
                return Reload::Broken(e);
            }
        };
        if files == self.last {
            return Reload::Unchanged;
        }
        let loaded = load_pair(&files.0, &files.1, &self.cert_path, &self.key_path);
        self.last = files;
        match loaded {
            Ok(loaded) => Reload::Loaded(loaded),
            Err(e) => Reload::Broken(e),
        }
    }
}

fn read_both(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn load(cert: &str, key: &str) -> Result<Loaded, TlsError> {
        load_pair(
            cert.as_bytes(),
            key.as_bytes(),
            Path::new("tls.crt"),
            Path::new("tls.key"),
        )
    }

    #[test]
    fn a_pair_loads_with_its_expiry() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["a".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 17);
        let cert = params.self_signed(&key).unwrap();
        let loaded = load(&cert.pem(), &key.serialize_pem()).unwrap();
        // 2031-05-17T00:00:00Z
        assert_eq!(loaded.not_after, 1_936_742_400);
        assert_eq!(loaded.key.cert.len(), 1);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_and_named() {
        let (cert, _) = pair("a");
        let (_, other_key) = pair("b");
        let e = load(&cert, &other_key).unwrap_err();
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
        assert!(
            e.to_string().contains("tls.key does not go with tls.crt"),
            "{e}"
        );
    }

    #[test]
    fn half_written_or_empty_files_are_errors_not_panics() {
        let (cert, key) = pair("a");
        let e = load("", &key).unwrap_err();
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");
        let half = &cert[..cert.len() / 2];
        assert!(load(half, &key).is_err());
        assert!(load(&cert, &key[..key.len() / 2]).is_err());
        assert!(load(&cert, "").is_err());
        // A PEM block that is not DER of a certificate.
        let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let e = load(junk, &key).unwrap_err();
        assert!(matches!(e, TlsError::Certificate { .. }), "{e}");
    }

    #[test]
    fn the_watcher_reports_new_content_once_and_keeps_quiet_on_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = pair("a");
        std::fs::write(&crt, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let (mut w, _) = Watcher::start(crt.clone(), key.clone()).unwrap();
        assert!(matches!(w.check(), Reload::Unchanged));
        // Half a rotation: a new certificate, the old key.
        let (c2, k2) = pair("b");
        std::fs::write(&crt, &c2).unwrap();
        assert!(matches!(
            w.check(),
            Reload::Broken(TlsError::Mismatch { .. })
        ));
        assert!(matches!(w.check(), Reload::Unchanged), "reported once");
        std::fs::write(&key, &k2).unwrap();
        assert!(matches!(w.check(), Reload::Loaded(_)));
        assert!(matches!(w.check(), Reload::Unchanged));
        // Gone, then back with the same bytes: loaded again.
        std::fs::remove_file(&key).unwrap();
        assert!(matches!(w.check(), Reload::Broken(TlsError::Read { .. })));
        assert!(matches!(w.check(), Reload::Unchanged));
        std::fs::write(&key, &k2).unwrap();
        assert!(matches!(w.check(), Reload::Loaded(_)));
    }
}
