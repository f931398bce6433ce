//! Throwaway certificates for TLS tests: [`testkit::Pki`] (a CA, server and client
//! certificates as PEM files, removed on drop), and what our broker and a config file
//! make of them.

use std::ops::Deref;

use crate::Tls;
use crate::config::DEFAULT_TLS_TIMEOUT;
pub use testkit::CertFiles;

/// [`testkit::Pki`], with our broker's TLS made from it.
#[derive(Debug, Default)]
pub struct Pki(testkit::Pki);

impl Pki {
    pub fn new() -> Pki {
        Pki(testkit::Pki::new())
    }
}

impl Deref for Pki {
    type Target = testkit::Pki;

    fn deref(&self) -> &testkit::Pki {
        &self.0
    }
}

impl Pki {
    /// Our broker's TLS with the server certificate; with `verify`, clients need a
    /// certificate signed by the CA.
    pub fn server_tls(&self, verify: bool) -> Tls {
        let ca = verify.then_some(self.ca.as_path());
        Tls::from_files(&self.server.cert, &self.server.key, ca, DEFAULT_TLS_TIMEOUT).unwrap()
    }

    /// The same as a `tls { ... }` block of a config file, for nats-server or ours.
    pub fn conf_block(&self, verify: bool) -> String {
        format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: {verify}\n}}\n",
            self.server.cert, self.server.key, self.ca
        )
    }
}
