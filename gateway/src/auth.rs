//! Who may open a session: the handshake's token, checked by a [`TokenCheck`].
//!
//! - [`AnyToken`]: every token (development, or a gate behind its own auth).
//! - [`StaticToken`]: one token shared by every client.
//! - [`JwtCheck`]: signed player tokens (JWT). A valid token names the player (`sub`,
//!   bound as the session's uid before its first request), carries claims handlers can
//!   read, and may expire (`exp`, enforced during the session too).
//!
//! Every refusal says why, in the `HandshakeAck`'s message, and is counted by reason
//! (`gate_auth_failures_total{reason}`), so an operator can tell an attacker forging
//! signatures from clients with stale clocks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// The check `config` asks for: signed tokens when a --jwt-* key is given, else the
/// shared token when one is given, else any token.
pub fn from_config(config: &crate::GateConfig) -> Result<Arc<dyn TokenCheck>, KeyError> {
    let jwt = config.jwt_secret_file.is_some() || !config.jwt_public_key.is_empty();
    if jwt && !config.token.is_empty() {
        return Err(KeyError::Both);
    }
    Ok(if jwt {
        Arc::new(JwtCheck::load(
            config.jwt_secret_file.as_deref(),
            &config.jwt_public_key,
            config.jwt_audience.clone(),
            config.jwt_issuer.clone(),
        )?)
    } else if config.token.is_empty() {
        Arc::new(AnyToken)
    } else {
        Arc::new(StaticToken(config.token.clone()))
    })
}

/// Who a token says the player is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Bound as the session's uid.
    pub uid: String,
    /// The token's other claims, for handlers: strings as they are, anything else as
    /// its JSON text.
    pub claims: HashMap<String, String>,
    /// When the token stops being valid; the gate closes the session then unless the
    /// client sends a fresh token first.
    pub expires: Option<SystemTime>,
}

/// Why a token was refused: each with its own message and metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("token refused")]
    Refused,
    #[error("token is not a JWT: {0}")]
    Malformed(String),
    #[error("token uses alg none: unsigned tokens are refused")]
    AlgNone,
    #[error("token algorithm {0} does not match any configured key")]
    WrongAlgorithm(String),
    #[error("token signature does not verify")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token not yet valid")]
    NotYetValid,
    #[error("token audience is not accepted")]
    WrongAudience,
    #[error("token issuer is not accepted")]
    WrongIssuer,
    #[error("token has no sub")]
    MissingSub,
}

impl AuthError {
    /// The `reason` label of `gate_auth_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Refused => "refused",
            AuthError::Malformed(_) => "malformed",
            AuthError::AlgNone => "alg_none",
            AuthError::WrongAlgorithm(_) => "wrong_algorithm",
            AuthError::BadSignature => "bad_signature",
            AuthError::Expired => "expired",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::WrongAudience => "wrong_audience",
            AuthError::WrongIssuer => "wrong_issuer",
            AuthError::MissingSub => "missing_sub",
        }
    }
}

/// Decides whether a handshake's token may open a session, and who it names.
pub trait TokenCheck: Send + Sync + 'static {
    /// `Ok(None)`: welcome, anonymous (a service may bind a uid later);
    /// `Ok(Some(identity))`: welcome as that player.
    fn check(&self, token: &str) -> Result<Option<Identity>, AuthError>;
}

/// Accepts every token: for development and for gates behind their own auth.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnyToken;

impl TokenCheck for AnyToken {
    fn check(&self, _token: &str) -> Result<Option<Identity>, AuthError> {
        Ok(None)
    }
}

/// Accepts exactly one shared token.
#[derive(Debug, Clone)]
pub struct StaticToken(pub String);

impl TokenCheck for StaticToken {
    fn check(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        if token == self.0 {
            Ok(None)
        } else {
            Err(AuthError::Refused)
        }
    }
}

/// One verification key and the algorithms it may verify.
struct Key {
    key: DecodingKey,
    algorithms: &'static [Algorithm],
}

const HMAC: &[Algorithm] = &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
const RSA: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];
const EC: &[Algorithm] = &[Algorithm::ES256, Algorithm::ES384];
const ED: &[Algorithm] = &[Algorithm::EdDSA];

/// Checks signed player tokens against configured keys.
pub struct JwtCheck {
    keys: Vec<Key>,
    audience: Option<String>,
    issuer: Option<String>,
}

impl std::fmt::Debug for JwtCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtCheck")
            .field("keys", &self.keys.len())
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .finish()
    }
}

/// Why a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} holds no RSA, EC or Ed25519 public key in PEM")]
    NotAKey(String),
    #[error("{0} is empty: an HMAC secret needs bytes")]
    EmptySecret(String),
    #[error("no key given: --jwt-secret-file or --jwt-public-key")]
    NoKey,
    #[error("--token and the --jwt-* flags are two ways to check tokens: give one")]
    Both,
}

impl JwtCheck {
    /// A check with the HMAC secret in `secret_file` (trailing whitespace and newlines
    /// are not part of the secret) and/or the PEM public keys in `public_keys` (more
    /// than one for rotation: a token verifying against any of them is valid).
    pub fn load(
        secret_file: Option<&Path>,
        public_keys: &[impl AsRef<Path>],
        audience: Option<String>,
        issuer: Option<String>,
    ) -> Result<JwtCheck, KeyError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| KeyError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        let mut keys = Vec::new();
        if let Some(path) = secret_file {
            let mut secret = read(path)?;
            while secret.last().is_some_and(u8::is_ascii_whitespace) {
                secret.pop();
            }
            if secret.is_empty() {
                return Err(KeyError::EmptySecret(path.display().to_string()));
            }
            keys.push(Key {
                key: DecodingKey::from_secret(&secret),
                algorithms: HMAC,
            });
        }
        for path in public_keys {
            let path = path.as_ref();
            let pem = read(path)?;
            let key = if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                Key {
                    key,
                    algorithms: RSA,
                }
            } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                Key {
                    key,
                    algorithms: EC,
                }
            } else if let Ok(key) = DecodingKey::from_ed_pem(&pem) {
                Key {
                    key,
                    algorithms: ED,
                }
            } else {
                return Err(KeyError::NotAKey(path.display().to_string()));
            };
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(KeyError::NoKey);
        }
        Ok(JwtCheck {
            keys,
            audience,
            issuer,
        })
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut v = Validation::new(algorithm);
        // Expiry is exact, as the session's own expiry is: a token valid at the
        // handshake is not closed seconds later for a leeway the check allowed.
        v.leeway = 0;
        v.validate_nbf = true;
        v.required_spec_claims = ["sub".to_owned()].into();
        match &self.audience {
            Some(aud) => v.set_audience(&[aud]),
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        v
    }
}

impl TokenCheck for JwtCheck {
    fn check(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        let algorithm = header_algorithm(token)?;
        let mut last = None;
        for key in self
            .keys
            .iter()
            .filter(|k| k.algorithms.contains(&algorithm))
        {
            match jsonwebtoken::decode::<Map<String, Value>>(
                token,
                &key.key,
                &self.validation(algorithm),
            ) {
                Ok(data) => return identity(data.claims).map(Some),
                // Another key (rotation) may verify it.
                Err(e) if *e.kind() == ErrorKind::InvalidSignature => {
                    last = Some(AuthError::BadSignature);
                }
                Err(e) => return Err(refusal(e.kind())),
            }
        }
        Err(last.unwrap_or_else(|| AuthError::WrongAlgorithm(format!("{algorithm:?}"))))
    }
}

/// The header's `alg`, read before anything else so `none` and unknown names get
/// their own answers.
fn header_algorithm(token: &str) -> Result<Algorithm, AuthError> {
    let header = token
        .split('.')
        .next()
        .and_then(|h| URL_SAFE_NO_PAD.decode(h).ok())
        .and_then(|h| serde_json::from_slice::<Map<String, Value>>(&h).ok())
        .ok_or_else(|| AuthError::Malformed("its header does not decode".into()))?;
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
    if alg.eq_ignore_ascii_case("none") {
        return Err(AuthError::AlgNone);
    }
    alg.parse()
        .map_err(|_| AuthError::WrongAlgorithm(alg.to_owned()))
}

fn refusal(kind: &ErrorKind) -> AuthError {
    match kind {
        ErrorKind::ExpiredSignature => AuthError::Expired,
        ErrorKind::ImmatureSignature => AuthError::NotYetValid,
        ErrorKind::InvalidAudience => AuthError::WrongAudience,
        ErrorKind::InvalidIssuer => AuthError::WrongIssuer,
        ErrorKind::MissingRequiredClaim(_) => AuthError::MissingSub,
        ErrorKind::InvalidSignature => AuthError::BadSignature,
        ErrorKind::InvalidAlgorithm => AuthError::WrongAlgorithm("for this key".into()),
        other => AuthError::Malformed(format!("{other:?}")),
    }
}

fn identity(mut claims: Map<String, Value>) -> Result<Identity, AuthError> {
    let uid = match claims.remove("sub") {
        Some(Value::String(sub)) if !sub.is_empty() => sub,
        _ => return Err(AuthError::MissingSub),
    };
    // Checked all the way: a signed token may carry any number, and one too far out to
    // be a time (or a fraction) must neither panic nor expire at once; it never expires.
    let expires = claims
        .get("exp")
        .and_then(Value::as_f64)
        .and_then(|exp| Duration::try_from_secs_f64(exp).ok())
        .and_then(|exp| SystemTime::UNIX_EPOCH.checked_add(exp));
    let claims = claims
        .into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect();
    Ok(Identity {
        uid,
        claims,
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn secret_check(aud: Option<&str>, iss: Option<&str>) -> JwtCheck {
        // One file per call: tests run in parallel, and a file rewritten while another
        // test reads it reads empty.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("jwt-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "s3cret\n").unwrap();
        let none: &[&Path] = &[];
        JwtCheck::load(Some(&path), none, aud.map(Into::into), iss.map(Into::into)).unwrap()
    }

    fn hs256(claims: &Value, secret: &[u8]) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    #[test]
    fn a_valid_token_names_the_player_and_keeps_its_claims() {
        let check = secret_check(Some("game"), Some("studio"));
        let exp = now() + 60;
        let token = hs256(
            &json!({"sub": "ann", "exp": exp, "aud": "game", "iss": "studio", "role": "admin", "level": 7}),
            b"s3cret",
        );
        let id = check.check(&token).unwrap().unwrap();
        assert_eq!(id.uid, "ann");
        assert_eq!(id.claims["role"], "admin");
        assert_eq!(id.claims["level"], "7");
        assert_eq!(
            id.expires,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(exp))
        );
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let check = secret_check(Some("game"), Some("studio"));
        let ok = json!({"sub": "ann", "exp": now() + 60, "aud": "game", "iss": "studio"});
        let with = |patch: Value| {
            let mut claims = ok.clone();
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    claims.as_object_mut().unwrap().remove(k);
                } else {
                    claims[k] = v.clone();
                }
            }
            claims
        };
        let cases = [
            (hs256(&ok, b"wrong"), AuthError::BadSignature),
            (
                hs256(&with(json!({"exp": now() - 10})), b"s3cret"),
                AuthError::Expired,
            ),
            (
                hs256(&with(json!({"nbf": now() + 600})), b"s3cret"),
                AuthError::NotYetValid,
            ),
            (
                hs256(&with(json!({"aud": "other"})), b"s3cret"),
                AuthError::WrongAudience,
            ),
            (
                hs256(&with(json!({"iss": "other"})), b"s3cret"),
                AuthError::WrongIssuer,
            ),
            (
                hs256(&with(json!({"sub": null})), b"s3cret"),
                AuthError::MissingSub,
            ),
            (
                hs256(&with(json!({"sub": ""})), b"s3cret"),
                AuthError::MissingSub,
            ),
            (
                "garbage".to_owned(),
                AuthError::Malformed("its header does not decode".into()),
            ),
        ];
        for (token, expected) in cases {
            assert_eq!(check.check(&token), Err(expected));
        }
        // alg none: a header saying so and no signature.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let body = URL_SAFE_NO_PAD.encode(ok.to_string());
        assert_eq!(
            check.check(&format!("{header}.{body}.")),
            Err(AuthError::AlgNone)
        );
        // An RS256 token where only an HMAC secret is configured.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        assert!(matches!(
            check.check(&format!("{header}.{body}.c2ln")),
            Err(AuthError::WrongAlgorithm(_))
        ));
    }

    #[test]
    fn an_expiry_too_far_to_be_a_time_is_no_expiry() {
        let check = secret_check(None, None);
        let token = hs256(&json!({"sub": "ann", "exp": u64::MAX}), b"s3cret");
        assert_eq!(check.check(&token).unwrap().unwrap().expires, None);
    }

    #[test]
    fn static_token_checks_exactly() {
        assert_eq!(StaticToken("s3cret".into()).check("s3cret"), Ok(None));
        assert_eq!(
            StaticToken("s3cret".into()).check("s3cre"),
            Err(AuthError::Refused)
        );
        assert_eq!(AnyToken.check(""), Ok(None));
    }

    #[test]
    fn keys_must_load() {
        let none: &[&Path] = &[];
        assert!(matches!(
            JwtCheck::load(None, none, None, None),
            Err(KeyError::NoKey)
        ));
        assert!(matches!(
            JwtCheck::load(Some(Path::new("/nonexistent/secret")), none, None, None),
            Err(KeyError::Read { .. })
        ));
    }
}
