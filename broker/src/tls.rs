//! TLS for client connections, the way nats-server does it, so real NATS clients connect
//! unchanged: the server sends INFO in plaintext with `"tls_required":true`, the client
//! starts the TLS handshake on the same socket, and everything after (CONNECT first) is
//! inside TLS. With `verify`, clients must present a certificate signed by the CA.
//!
//! rustls with the ring provider, chosen explicitly rather than through a process-wide
//! default, so no other crate's choice of provider can make the handshake panic.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use net::LogLimiter;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::timeout_at;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

/// What a client that does not start TLS is told (nats-server's words, which clients know).
const TLS_REQUIRED_ERR: &[u8] = b"-ERR 'Secure Connection - TLS Required'\r\n";
/// The first byte of every TLS record that opens a handshake.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A broker's TLS setup: the server certificate, and the CA client certificates must be
/// signed by when `verify` is on. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Tls {
    config: Arc<ServerConfig>,
    verify: bool,
    timeout: Duration,
}

/// Why a TLS setup could not be built; each names the file at fault, and its source
/// says what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what} {}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("CA file {}", path.display())]
    Ca {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("client verification with CA file {}", path.display())]
    Verifier {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("certificate {} with key {}", cert.display(), key.display())]
    Certificate {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// Why a client's handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("the client did not start TLS (sent plaintext)")]
    NotTls,
    #[error("no TLS handshake within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(std::io::Error),
}

impl Tls {
    /// Loads the server certificate chain and key (PEM files). With `client_ca`, every
    /// client must present a certificate that chains to that CA (nats-server's
    /// `verify`); without it, none is asked for.
    pub fn from_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        timeout: Duration,
    ) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Certificate {
                cert: cert.to_owned(),
                key: key.to_owned(),
                source,
            })?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(ca, "CA file")? {
                    roots.add(cert).map_err(|source| TlsError::Ca {
                        path: ca.to_owned(),
                        source,
                    })?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|source| TlsError::Verifier {
                        path: ca.to_owned(),
                        source,
                    })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let chain = read_certs(cert, "certificate file")?;
        let private_key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Pem {
            what: "key file",
            path: key.to_owned(),
            source,
        })?;
        let config = builder
            .with_single_cert(chain, private_key)
            .map_err(|source| TlsError::Certificate {
                cert: cert.to_owned(),
                key: key.to_owned(),
                source,
            })?;
        Ok(Tls {
            config: Arc::new(config),
            verify: client_ca.is_some(),
            timeout,
        })
    }

    /// Whether clients must present a certificate signed by the CA (INFO's `tls_verify`).
    pub fn verify(&self) -> bool {
        self.verify
    }

    /// How long a client has to complete its handshake after INFO.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Upgrades a connection that has been sent INFO. A client whose first bytes are not
    /// a TLS handshake (it spoke plaintext) or that stays silent past the timeout is told
    /// TLS is required, in plaintext, as nats-server did. A failure is recorded in
    /// `failures` before the connection closes, so whoever sees it close sees it counted.
    pub(crate) async fn accept(
        &self,
        mut stream: TcpStream,
        addr: SocketAddr,
        failures: &HandshakeFailures,
    ) -> Option<TlsStream<TcpStream>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut first = [0_u8; 1];
        let refusal = match timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(0)) => HandshakeError::Io(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(Ok(_)) if first[0] == TLS_HANDSHAKE_RECORD => {
                let acceptor = TlsAcceptor::from(self.config.clone());
                let error = match timeout_at(deadline, acceptor.accept(stream)).await {
                    Ok(Ok(upgraded)) => return Some(upgraded),
                    Ok(Err(e)) => HandshakeError::Io(e),
                    Err(_) => HandshakeError::Timeout(self.timeout),
                };
                failures.record(addr, &error);
                return None;
            }
            Ok(Ok(_)) => HandshakeError::NotTls,
            Ok(Err(e)) => HandshakeError::Io(e),
            Err(_) => HandshakeError::Timeout(self.timeout),
        };
        // Best effort and bounded: the socket's buffer is empty, so this never waits.
        let _ = tokio::time::timeout(self.timeout, stream.write_all(TLS_REQUIRED_ERR)).await;
        failures.record(addr, &refusal);
        None
    }
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let error = |source| TlsError::Pem {
        what,
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(error)?;
    if certs.is_empty() {
        return Err(error(rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

/// Failed handshakes are logged like every other peer-triggered event: one line per
/// second with its count, so a port scanner or a misconfigured fleet cannot flood the log.
static FAILURE_LOG: LogLimiter = LogLimiter::per_second();

/// Failed handshakes, counted for monitoring.
#[derive(Debug, Default)]
pub(crate) struct HandshakeFailures {
    total: AtomicU64,
}

impl HandshakeFailures {
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn record(&self, addr: SocketAddr, error: &HandshakeError) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if let Some(tally) = FAILURE_LOG.check() {
            tracing::warn!(%addr, "TLS handshake failed{tally}: {error}");
        }
    }
}
