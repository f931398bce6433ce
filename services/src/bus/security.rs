//! How gates and workers prove who they are to NATS, and keep the bus private: one set
//! of flags for both (`--nats-user`/`--nats-password`, `--nats-token`, `--nats-nkey`,
//! `--nats-creds`, `--nats-tls`, `--nats-ca`, `--nats-tls-cert`/`--nats-tls-key`, each
//! with a `SHADDOCK_NATS_*` environment fallback), applied to async-nats in one place.
//!
//! Every file is read when the process starts, so a missing or malformed one stops it
//! with the file's name, instead of failing every reconnect in the background.
//!
//! TLS uses a rustls configuration built here with the ring provider named explicitly,
//! so the handshake never depends on which crypto provider other crates compile in.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use async_nats::ConnectOptions;
use net::BusCredentials;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// Credentials and TLS for the bus connection. The default is what a local development
/// bus needs: nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct BusSecurity {
    /// NATS user name (with --nats-password). A user and password in the URL work too.
    #[arg(long, env = "SHADDOCK_NATS_USER", value_name = "USER")]
    #[arg(requires = "nats_password", conflicts_with_all = ["nats_token", "nats_nkey", "nats_creds"])]
    pub nats_user: Option<String>,

    /// Password of --nats-user.
    #[arg(long, env = "SHADDOCK_NATS_PASSWORD", value_name = "PASSWORD")]
    #[arg(requires = "nats_user", hide_env_values = true)]
    pub nats_password: Option<String>,

    /// NATS authorization token.
    #[arg(
        long,
        env = "SHADDOCK_NATS_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    #[arg(conflicts_with_all = ["nats_nkey", "nats_creds"])]
    pub nats_token: Option<String>,

    /// File holding a user NKey seed (`SU...`): the server sends a nonce at connect and
    /// the seed signs it, so no secret crosses the wire.
    #[arg(long, env = "SHADDOCK_NATS_NKEY", value_name = "FILE")]
    #[arg(conflicts_with = "nats_creds")]
    pub nats_nkey: Option<PathBuf>,

    /// Credentials file (`.creds`: a user JWT and its NKey seed), for servers in
    /// operator/JWT mode.
    #[arg(long, env = "SHADDOCK_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,

    /// Require TLS, trusting the system's root certificates (implied by --nats-ca and
    /// --nats-tls-cert). A server that offers plaintext is then refused.
    #[arg(long, env = "SHADDOCK_NATS_TLS")]
    pub nats_tls: bool,

    /// CA certificate (PEM) that the servers' certificates must chain to, instead of the
    /// system's roots. Implies TLS.
    #[arg(long, env = "SHADDOCK_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,

    /// Client certificate (PEM, with --nats-tls-key) for servers that verify clients
    /// (nats-server's `verify`, our broker's --tlsverify). Implies TLS.
    #[arg(long, env = "SHADDOCK_NATS_TLS_CERT", value_name = "FILE")]
    #[arg(requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --nats-tls-cert.
    #[arg(long, env = "SHADDOCK_NATS_TLS_KEY", value_name = "FILE")]
    #[arg(requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
}

impl BusSecurity {
    /// Adds these credentials and TLS settings to `options`, reading every file now.
    pub async fn apply(&self, mut options: ConnectOptions) -> anyhow::Result<ConnectOptions> {
        if let (Some(user), Some(password)) = (&self.nats_user, &self.nats_password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.nats_token {
            options = options.token(token.clone());
        }
        if let Some(path) = &self.nats_nkey {
            options = options.nkey(read_seed(path)?);
        }
        if let Some(path) = &self.nats_creds {
            options = options
                .credentials_file(path)
                .await
                .with_context(|| format!("reading NATS credentials file {}", path.display()))?;
        }
        if let Some(tls) = self.tls_config()? {
            options = options.tls_client_config(tls).require_tls(true);
        }
        Ok(options)
    }

    /// The credentials, read from their files now, for clients other than async-nats
    /// (the gate's own bus connection).
    pub fn credentials(&self) -> anyhow::Result<BusCredentials> {
        if let (Some(user), Some(password)) = (&self.nats_user, &self.nats_password) {
            return Ok(BusCredentials::UserPassword {
                user: user.clone(),
                password: password.clone(),
            });
        }
        if let Some(token) = &self.nats_token {
            return Ok(BusCredentials::Token(token.clone()));
        }
        if let Some(path) = &self.nats_nkey {
            return Ok(BusCredentials::NKey(read_seed(path)?));
        }
        if let Some(path) = &self.nats_creds {
            let (jwt, seed) = read_creds(path)?;
            return Ok(BusCredentials::Jwt { jwt, seed });
        }
        Ok(BusCredentials::None)
    }

    /// The TLS client configuration, when TLS is wanted.
    pub fn tls_config(&self) -> anyhow::Result<Option<ClientConfig>> {
        if !(self.nats_tls || self.nats_ca.is_some() || self.nats_tls_cert.is_some()) {
            return Ok(None);
        }
        let mut roots = RootCertStore::empty();
        match &self.nats_ca {
            Some(ca) => {
                for cert in read_certs(ca, "NATS CA file")? {
                    roots
                        .add(cert)
                        .with_context(|| format!("NATS CA file {}", ca.display()))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
                anyhow::ensure!(
                    !roots.is_empty(),
                    "no system root certificates to verify NATS servers with ({:?}); \
                     give the CA with --nats-ca",
                    native.errors
                );
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots);
        let config = match (&self.nats_tls_cert, &self.nats_tls_key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "NATS client certificate")?;
                let key_der = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("reading NATS client key file {}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .with_context(|| {
                        format!(
                            "NATS client certificate {} with key {}",
                            cert.display(),
                            key.display()
                        )
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(config))
    }
}

/// The JWT and the seed of a `.creds` file: each the first non-empty line after its
/// `-----BEGIN ...-----` marker.
fn read_creds(path: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading NATS credentials file {}", path.display()))?;
    let after = |marker: &str| {
        text.lines()
            .skip_while(|l| !(l.contains("BEGIN") && l.contains(marker)))
            .skip(1)
            .map(str::trim)
            .find(|l| !l.is_empty())
            .filter(|l| !l.starts_with("---"))
            .map(str::to_owned)
    };
    let jwt = after("JWT")
        .with_context(|| format!("no user JWT in NATS credentials file {}", path.display()))?;
    let seed = after("SEED")
        .with_context(|| format!("no NKey seed in NATS credentials file {}", path.display()))?;
    nkeys::KeyPair::from_seed(&seed)
        .with_context(|| format!("invalid NKey seed in {}", path.display()))?;
    Ok((jwt, seed))
}

/// The certificates in a PEM file; none at all is an error too.
fn read_certs(path: &Path, what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let context = || format!("reading {what} {}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(context)?
        .collect::<Result<Vec<_>, _>>()
        .with_context(context)?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{what} {} holds no certificate",
        path.display()
    );
    Ok(certs)
}

/// The user seed in an NKey seed file (nats.go's format: the seed on a line of its own,
/// possibly between comment lines), checked so a bad file fails now.
fn read_seed(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading NATS NKey seed file {}", path.display()))?;
    let seed = text
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("SU"))
        .with_context(|| format!("no user seed (SU...) in {}", path.display()))?;
    nkeys::KeyPair::from_seed(seed)
        .with_context(|| format!("invalid NKey seed in {}", path.display()))?;
    Ok(seed.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        security: BusSecurity,
    }

    fn parse(args: &[&str]) -> Result<BusSecurity, clap::Error> {
        Cli::try_parse_from([&["test"], args].concat()).map(|cli| cli.security)
    }

    #[test]
    fn flags_parse_and_conflict() {
        let parsed = parse(&["--nats-user", "u", "--nats-password", "p"]).unwrap();
        assert_eq!(parsed.nats_user.as_deref(), Some("u"));
        assert!(
            parse(&["--nats-user", "u"]).is_err(),
            "user without password"
        );
        assert!(parse(&["--nats-token", "t", "--nats-creds", "c"]).is_err());
        let both = [
            "--nats-user",
            "u",
            "--nats-password",
            "p",
            "--nats-token",
            "t",
        ];
        assert!(parse(&both).is_err());
        assert!(
            parse(&["--nats-tls-cert", "c"]).is_err(),
            "cert without key"
        );
    }

    #[tokio::test]
    async fn missing_files_are_named() {
        for (flag, file) in [
            ("--nats-ca", "no-such-ca.pem"),
            ("--nats-nkey", "no-such.nk"),
            ("--nats-creds", "no-such.creds"),
        ] {
            let security = parse(&[flag, file]).unwrap();
            let error = security.apply(ConnectOptions::new()).await.unwrap_err();
            assert!(format!("{error:#}").contains(file), "{flag}: {error:#}");
        }
    }

    #[tokio::test]
    async fn nothing_set_means_plain_options() {
        assert!(BusSecurity::default().tls_config().unwrap().is_none());
        let tls = BusSecurity {
            nats_tls: true,
            ..BusSecurity::default()
        };
        // The system's roots, when the machine has any; otherwise an error saying so.
        if let Err(error) = tls.tls_config() {
            assert!(error.to_string().contains("--nats-ca"), "{error:#}");
        }
    }
}
