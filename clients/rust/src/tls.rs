//! `wss://` for the SDK's clients: a rustls client configuration trusting the CA
//! certificates in one PEM file. There are no system roots here, so a client names
//! what it trusts. (The gate's side, its certificate and its reloads, is the gate's.)

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// Why a CA file could not make a client configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificates from {path}: {error}")]
    Certificates { path: String, error: String },
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    #[error("{path} holds a certificate rustls cannot trust as a CA: {error}")]
    Ca { path: String, error: String },
    #[error("cannot make a TLS client: {0}")]
    Client(tokio_rustls::rustls::Error),
}

/// A TLS client configuration (ring provider, safe default protocol versions, no client
/// certificate) that trusts exactly the CA certificates in the PEM file `ca`: what
/// [`ClientOptions::tls`](crate::ClientOptions::tls) wants for a gate whose certificate
/// that CA signed.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certificates {
            path: ca.display().to_string(),
            error: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(ca.display().to_string()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::Ca {
            path: ca.display().to_string(),
            error: e.to_string(),
        })?;
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Client)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
