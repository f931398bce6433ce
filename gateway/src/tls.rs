//! `wss://`: the gate's TLS, with rustls, and a certificate that can be replaced while
//! the gate runs.
//!
//! [`Tls::reload`] reads the certificate and key files again (the binary calls it on
//! SIGHUP): connections accepted afterwards use the new pair, and sessions already open
//! keep the one they were accepted with, so a renewal drops nobody. A reload that fails
//! (a missing file, a key that does not match) keeps the pair in use and says why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate and key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificates from {path}: {error}")]
    Certificates { path: String, error: String },
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    #[error("cannot read the private key from {path}: {error}")]
    Key { path: String, error: String },
    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] tokio_rustls::rustls::Error),
}

/// The gate's TLS: the files it reads and the acceptor made from them.
#[derive(Clone)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    acceptor: Arc<RwLock<TlsAcceptor>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

impl Tls {
    /// Loads the PEM certificate chain in `cert` and the PEM private key in `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let acceptor = acceptor(cert, key)?;
        Ok(Tls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            acceptor: Arc::new(RwLock::new(acceptor)),
        })
    }

    /// Reads the files again; on success new connections use them.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = acceptor(&self.cert, &self.key)?;
        *self
            .acceptor
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The acceptor for a new connection (a reference count, not a copy).
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The PEM certificates in `path`, at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certificates {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.display().to_string()));
    }
    Ok(certs)
}

fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.display().to_string(),
        error: e.to_string(),
    })?;
    // The provider is named, not taken from a process default another crate may set.
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
