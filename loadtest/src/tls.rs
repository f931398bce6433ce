//! A throwaway certificate authority and a gate certificate it signed, for load tests
//! over `wss://` on a launched topology ([`crate::topology::TopologySpec::tls`]): made
//! with rcgen at launch in a fresh temporary folder, which is removed when the
//! [`Certs`] is dropped. The key never leaves loopback and dies with the run; clients
//! trust only this CA.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// The names the gate certificate is for: launched gates listen on 127.0.0.1.
const NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// PEM files: the CA certificate, the gate's certificate and its private key.
#[derive(Debug)]
pub struct Certs {
    dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    /// Makes the CA and the gate certificate and writes them to a new folder under the
    /// system's temporary directory.
    pub fn create() -> anyhow::Result<Certs> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "shaddock-loadtest-tls-{}-{nanos}",
            std::process::id()
        ));
        // `create_dir`, not `create_dir_all`: a folder that already exists is not ours.
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let certs = Certs {
            ca: dir.join("ca.pem"),
            cert: dir.join("gate-cert.pem"),
            key: dir.join("gate-key.pem"),
            dir,
        };
        certs
            .write()
            .context("making a throwaway CA and gate certificate")?;
        Ok(certs)
    }

    fn write(&self) -> anyhow::Result<()> {
        let mut ca = CertificateParams::new(Vec::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate()?;
        write_file(&self.ca, ca.self_signed(&ca_key)?.pem().as_bytes())?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let cert =
            CertificateParams::new(NAMES.map(String::from).to_vec())?.signed_by(&key, &issuer)?;
        write_file(&self.cert, cert.pem().as_bytes())?;
        write_file(&self.key, key.serialize_pem().as_bytes())
    }
}

/// Writes a new file readable by this user only (it may be a private key).
fn write_file(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(contents))
        .with_context(|| format!("writing {}", path.display()))
}

impl Drop for Certs {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_configuration_trusts_the_ca_and_the_folder_goes_with_the_certs() {
        let certs = Certs::create().unwrap();
        assert!(certs.cert.is_file() && certs.key.is_file());
        sdk::tls_client_config(&certs.ca).unwrap();
        gateway::tls::Tls::load(&certs.cert, &certs.key).unwrap();
        let dir = certs.dir.clone();
        drop(certs);
        assert!(!dir.exists());
    }
}
