//! NATS decentralized auth, made at test time (nothing secret is committed): an
//! operator, accounts it signs, users an account signs, each a NATS v2 JWT, and a
//! user's `.creds` file; plus the nats-server configuration that trusts the operator.
//!
//! A NATS JWT is `header.claims.signature`, each part base64url without padding:
//!
//! - header: `{"typ":"JWT","alg":"ed25519-nkey"}`;
//! - claims: `jti`, `iat` (seconds), `iss` (the signer's public NKey), `sub` (the
//!   subject's public NKey: `O...`, `A...` or `U...`), `name`, and `nats`, which holds
//!   `type` (`operator`, `account` or `user`), `version: 2` and the type's own fields;
//! - signature: ed25519 over the bytes of `header.claims` (both parts encoded, with the
//!   dot) by the issuer's NKey. An operator signs itself, the operator signs an account,
//!   an account signs its users.
//!
//! `jti` is computed as nats-io/jwt computes it: the unpadded base32 of the SHA-512/256
//! of the standard claims as JSON (here `iat`, `iss`, `name`, `sub`, in that order)
//! without `jti`. nats-server does not check it (it verifies the signature, the chain of
//! issuers and the times); it is computed the same way so these tokens read like any
//! tool's.
//!
//! Limits: an account or user without `limits` would have every limit zero, which
//! nats-server reads as "no connection, no subscription, no payload", so both say `-1`
//! (unlimited) like nats-io/jwt's constructors.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha512_256};

const HEADER: &str = r#"{"typ":"JWT","alg":"ed25519-nkey"}"#;

/// Unlimited, as nats-io/jwt's `NoLimit`.
const NO_LIMIT: i64 = -1;

/// The trust root: nats-server is configured with its JWT.
pub struct Operator {
    key: KeyPair,
    pub jwt: String,
}

/// An account the operator signed; its users connect with JWTs it signs.
pub struct Account {
    key: KeyPair,
    pub jwt: String,
}

/// A user the account signed: its JWT and the seed that proves it holds the key.
pub struct User {
    key: KeyPair,
    pub jwt: String,
}

impl Operator {
    /// A self-signed operator named `name`.
    pub fn new(name: &str) -> Operator {
        let key = KeyPair::new_operator();
        let nats = json!({ "type": "operator", "version": 2 });
        let jwt = sign(&key, &key.public_key(), name, nats);
        Operator { key, jwt }
    }

    /// An account named `name`, signed by this operator, without limits.
    pub fn account(&self, name: &str) -> Account {
        let key = KeyPair::new_account();
        let nats = json!({
            "type": "account",
            "version": 2,
            "limits": {
                "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT,
                "imports": NO_LIMIT, "exports": NO_LIMIT, "wildcards": true,
                "conn": NO_LIMIT, "leaf": NO_LIMIT,
            },
        });
        let jwt = sign(&self.key, &key.public_key(), name, nats);
        Account { key, jwt }
    }

    /// A nats-server configuration in operator mode trusting this operator, with
    /// `accounts` preloaded in a memory resolver (the only accounts it will know).
    pub fn server_config(&self, accounts: &[&Account]) -> String {
        let preload: String = accounts
            .iter()
            .map(|a| format!("  {}: \"{}\"\n", a.public_key(), a.jwt))
            .collect();
        format!(
            "operator: \"{}\"\nresolver: MEMORY\nresolver_preload: {{\n{preload}}}\n",
            self.jwt
        )
    }
}

impl Account {
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// A user named `name`, signed by this account, allowed everything.
    pub fn user(&self, name: &str) -> User {
        let key = KeyPair::new_user();
        let nats = json!({
            "type": "user",
            "version": 2,
            "pub": {},
            "sub": {},
            "subs": NO_LIMIT,
            "data": NO_LIMIT,
            "payload": NO_LIMIT,
        });
        let jwt = sign(&self.key, &key.public_key(), name, nats);
        User { key, jwt }
    }
}

impl User {
    pub fn seed(&self) -> String {
        self.key.seed().unwrap()
    }

    /// This user's `.creds` file.
    pub fn creds(&self) -> String {
        creds(&self.jwt, &self.seed())
    }
}

/// A `.creds` file's text, as `nsc` writes it: the user JWT, then the NKey seed.
pub fn creds(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// The JWT of `subject` named `name` with the type's claims `nats`, signed by `issuer`.
fn sign(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> String {
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let iss = issuer.public_key();
    // serde_json's maps are ordered by key: iat, iss, name, sub, as Go marshals them.
    let standard = json!({ "iat": iat, "iss": iss, "name": name, "sub": subject });
    let digest = Sha512_256::digest(standard.to_string().as_bytes());
    let jti = data_encoding::BASE32_NOPAD.encode(&digest);
    let mut claims = standard;
    claims["jti"] = jti.into();
    claims["nats"] = nats;
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(HEADER),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}
