//! Throwaway certificates, made fresh with rcgen: a CA, a server certificate for
//! `127.0.0.1` and `localhost`, a client certificate signed by the CA, and one signed by
//! a stranger CA. Written as PEM files (what the flags and config files take), readable
//! by this user only, removed on drop. For TLS tests, and for the load tester's gates
//! serving `wss://`.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::temp_file;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA and certificates it signed; every file is removed on drop.
#[derive(Debug)]
pub struct Pki {
    /// The CA certificate (PEM): what clients trust and `--tlscacert` names.
    pub ca: PathBuf,
    /// For `127.0.0.1` and `localhost`, signed by the CA.
    pub server: CertFiles,
    /// A client certificate signed by the CA.
    pub client: CertFiles,
    /// A client certificate signed by a CA the server does not trust.
    pub stranger: CertFiles,
}

impl Pki {
    pub fn new() -> Pki {
        let (ca_pem, ca) = new_ca("shaddock test CA");
        let (_, stranger_ca) = new_ca("stranger CA");
        let server = leaf(
            &ca,
            "server",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf(&ca, "client", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let stranger = leaf(
            &stranger_ca,
            "stranger",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Pki {
            ca: temp_file("ca.pem", &ca_pem),
            server,
            client,
            stranger,
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let files = [&self.server, &self.client, &self.stranger];
        let paths = files.into_iter().flat_map(|f| [&f.cert, &f.key]);
        for path in paths.chain([&self.ca]) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A self-signed CA: its certificate's PEM, and the issuer that signs with it.
fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// A certificate for `names` (DNS names or IPs) signed by `issuer`, written to files.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    name: &str,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> CertFiles {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    CertFiles {
        cert: temp_file(&format!("{name}-cert.pem"), &cert.pem()),
        key: temp_file(&format!("{name}-key.pem"), &key.serialize_pem()),
    }
}
