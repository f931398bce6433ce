//! The credentials a Shaddock process presents to a NATS server, read once from the
//! bus flags (`services::BusSecurity`) and spoken by the gate's own bus connection.

use std::fmt;

/// What goes into CONNECT to prove who the process is.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum BusCredentials {
    #[default]
    None,
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
    /// A user NKey seed (`SU...`): signs the server's nonce.
    NKey(String),
    /// A user JWT and its NKey seed (a `.creds` file's two parts).
    Jwt {
        jwt: String,
        seed: String,
    },
}

impl fmt::Debug for BusCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secrets.
        let kind = match self {
            BusCredentials::None => "none",
            BusCredentials::UserPassword { .. } => "user and password",
            BusCredentials::Token(_) => "token",
            BusCredentials::NKey(_) => "nkey",
            BusCredentials::Jwt { .. } => "jwt",
        };
        f.write_str(kind)
    }
}
