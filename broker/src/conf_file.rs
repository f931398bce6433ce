//! Reader for the subset of nats-server's configuration file format that the broker's
//! flags cover, so a harness that hands "a nats-server" a `-c file.conf` can hand it to
//! us too.
//!
//! The format is nats-server's, not TOML: `key: value`, `key = value` or `key value`;
//! entries separated by newlines, `,` or `;`; `#` and `//` comments; quoted or bare
//! strings; sizes like `1MB`; durations like `"2m"` or plain seconds; and
//! `authorization { ... }` and `tls { ... }` blocks. Keys are case-insensitive, as in nats-server, and a
//! later key overrides an earlier one. Anything else (an unknown key, arrays, includes,
//! variables) is an error naming the line: silently ignoring a setting the operator
//! wrote is worse than refusing to start.
//!
//! [`parse`] is a pure function from text to [`FileConfig`]; reading the file and merging
//! with command-line flags is the caller's job (see `cli`).

use std::path::PathBuf;
use std::time::Duration;

use net::duration::parse_nats;

/// Every setting a config file may hold; `None` means "not in the file".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileConfig {
    pub host: Option<String>,
    /// Client port as written: `-1` asks for a random port, like `-p -1`.
    pub port: Option<i32>,
    pub http_host: Option<String>,
    /// Monitoring port as written: `-1` asks for a random port.
    pub http_port: Option<i32>,
    pub server_name: Option<String>,
    pub max_payload: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_control_line: Option<usize>,
    pub max_pending: Option<usize>,
    /// Flow control's mark (`--flow_control_pending`), a Shaddock extension.
    pub flow_control_pending: Option<usize>,
    /// Flow control's stall window (`--stall_window`), a Shaddock extension.
    pub stall_window: Option<Duration>,
    pub max_subscriptions: Option<usize>,
    pub ping_interval: Option<Duration>,
    pub ping_max: Option<u32>,
    pub write_deadline: Option<Duration>,
    pub authorization: Authorization,
    /// The `tls { ... }` block; its presence turns TLS on, as in nats-server.
    pub tls: Option<TlsBlock>,
    pub lame_duck_duration: Option<Duration>,
    pub lame_duck_grace_period: Option<Duration>,
    pub log_file: Option<PathBuf>,
    pub pid_file: Option<PathBuf>,
    pub ports_file_dir: Option<PathBuf>,
    pub debug: Option<bool>,
    pub trace: Option<bool>,
}

/// The `authorization { ... }` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Authorization {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub timeout: Option<Duration>,
}

/// The `tls { ... }` block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsBlock {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub verify: Option<bool>,
    pub timeout: Option<Duration>,
}

/// A config file error, with the 1-based line it was found on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct ConfError {
    pub line: usize,
    pub kind: ErrorKind,
}

/// What was wrong; tests match on this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    #[error("invalid value for `{key}`: {reason}")]
    InvalidValue { key: String, reason: String },
    #[error("`{0}` has no value")]
    MissingValue(String),
    #[error("`{0}` must be a block `{{ ... }}`")]
    ExpectedBlock(String),
    #[error("`{0}` takes a single value, not a block")]
    UnexpectedBlock(String),
    #[error("unexpected `{0}`")]
    Unexpected(char),
    #[error("unterminated string")]
    UnterminatedString,
    #[error("block `{0}` is never closed with `}}`")]
    UnclosedBlock(String),
}

/// Parses the text of a config file.
pub fn parse(text: &str) -> Result<FileConfig, ConfError> {
    let entries = Lexer::new(text).entries(None)?;
    let mut config = FileConfig::default();
    for entry in entries {
        apply(&mut config, entry)?;
    }
    Ok(config)
}

/// Parses a byte size: a plain number, or one with nats-server's suffixes (`k`, `m`,
/// `g`, `t` are powers of 1000; `kb`/`ki`/`kib` and friends are powers of 1024),
/// case-insensitive.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (expected e.g. 1048576, 64KB or 1MB)"))?;
    let multiplier: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1000,
        "kb" | "ki" | "kib" => 1 << 10,
        "m" => 1000 * 1000,
        "mb" | "mi" | "mib" => 1 << 20,
        "g" => 1000 * 1000 * 1000,
        "gb" | "gi" | "gib" => 1 << 30,
        "t" => 1000 * 1000 * 1000 * 1000,
        "tb" | "ti" | "tib" => 1 << 40,
        other => return Err(format!("unknown size suffix `{other}` in `{text}`")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// One `key value` pair as written, before its key is interpreted.
#[derive(Debug)]
struct Entry {
    key: String,
    line: usize,
    value: Value,
}

#[derive(Debug)]
enum Value {
    Scalar(String),
    Block(Vec<Entry>),
}

impl Entry {
    fn error(&self, kind: ErrorKind) -> ConfError {
        ConfError {
            line: self.line,
            kind,
        }
    }

    fn scalar(&self) -> Result<&str, ConfError> {
        match &self.value {
            Value::Scalar(text) => Ok(text),
            Value::Block(_) => Err(self.error(ErrorKind::UnexpectedBlock(self.key.clone()))),
        }
    }

    /// Interprets the scalar with `convert`, turning its message into an error at this line.
    fn convert<T>(&self, convert: impl FnOnce(&str) -> Result<T, String>) -> Result<T, ConfError> {
        convert(self.scalar()?).map_err(|reason| {
            self.error(ErrorKind::InvalidValue {
                key: self.key.clone(),
                reason,
            })
        })
    }

    fn string(&self) -> Result<String, ConfError> {
        self.scalar().map(str::to_owned)
    }
}

fn apply(config: &mut FileConfig, entry: Entry) -> Result<(), ConfError> {
    match entry.key.as_str() {
        "host" | "net" => config.host = Some(entry.string()?),
        "port" => config.port = Some(entry.convert(parse_port)?),
        "listen" => {
            let (host, port) = entry.convert(parse_host_port)?;
            config.host = host.or(config.host.take());
            config.port = Some(port);
        }
        "http_port" | "monitor_port" => config.http_port = Some(entry.convert(parse_port)?),
        "http" => {
            let (host, port) = entry.convert(parse_host_port)?;
            config.http_host = host.or(config.http_host.take());
            config.http_port = Some(port);
        }
        "server_name" => config.server_name = Some(entry.convert(parse_server_name)?),
        "max_payload" => config.max_payload = Some(entry.convert(parse_size)?),
        "max_connections" | "max_conn" => {
            config.max_connections = Some(entry.convert(parse_count)?);
        }
        "max_control_line" => config.max_control_line = Some(entry.convert(parse_size)?),
        "max_pending" => config.max_pending = Some(entry.convert(parse_size)?),
        "flow_control_pending" => {
            config.flow_control_pending = Some(entry.convert(parse_size)?);
        }
        "stall_window" => config.stall_window = Some(entry.convert(parse_nats)?),
        "max_subscriptions" | "max_subs" => {
            config.max_subscriptions = Some(entry.convert(parse_count)?);
        }
        "ping_interval" => config.ping_interval = Some(entry.convert(parse_nats)?),
        "ping_max" => config.ping_max = Some(entry.convert(parse_count)?),
        "write_deadline" => config.write_deadline = Some(entry.convert(parse_nats)?),
        "lame_duck_duration" => {
            config.lame_duck_duration = Some(entry.convert(parse_nats)?);
        }
        "lame_duck_grace_period" => {
            config.lame_duck_grace_period = Some(entry.convert(parse_nats)?);
        }
        "logfile" | "log_file" => config.log_file = Some(entry.string()?.into()),
        "pid_file" => config.pid_file = Some(entry.string()?.into()),
        "ports_file_dir" => config.ports_file_dir = Some(entry.string()?.into()),
        "debug" => config.debug = Some(entry.convert(parse_bool)?),
        "trace" => config.trace = Some(entry.convert(parse_bool)?),
        "authorization" => apply_authorization(&mut config.authorization, entry)?,
        "tls" => apply_tls(config.tls.get_or_insert_default(), entry)?,
        _ => return Err(entry.error(ErrorKind::UnknownKey(entry.key.clone()))),
    }
    Ok(())
}

/// The entries of a block such as `authorization { ... }`.
fn block_entries(block: Entry) -> Result<Vec<Entry>, ConfError> {
    let Entry { key, line, value } = block;
    match value {
        Value::Block(entries) => Ok(entries),
        Value::Scalar(_) => Err(ConfError {
            line,
            kind: ErrorKind::ExpectedBlock(key),
        }),
    }
}

fn apply_authorization(auth: &mut Authorization, block: Entry) -> Result<(), ConfError> {
    for entry in block_entries(block)? {
        match entry.key.as_str() {
            "user" | "username" => auth.user = Some(entry.string()?),
            "password" | "pass" => auth.password = Some(entry.string()?),
            "token" => auth.token = Some(entry.string()?),
            "timeout" => auth.timeout = Some(entry.convert(parse_nats)?),
            _ => {
                let key = format!("authorization.{}", entry.key);
                return Err(entry.error(ErrorKind::UnknownKey(key)));
            }
        }
    }
    Ok(())
}

fn apply_tls(tls: &mut TlsBlock, block: Entry) -> Result<(), ConfError> {
    for entry in block_entries(block)? {
        match entry.key.as_str() {
            "cert_file" => tls.cert_file = Some(entry.string()?.into()),
            "key_file" => tls.key_file = Some(entry.string()?.into()),
            "ca_file" => tls.ca_file = Some(entry.string()?.into()),
            "verify" => tls.verify = Some(entry.convert(parse_bool)?),
            "timeout" => tls.timeout = Some(entry.convert(parse_nats)?),
            _ => {
                let key = format!("tls.{}", entry.key);
                return Err(entry.error(ErrorKind::UnknownKey(key)));
            }
        }
    }
    Ok(())
}

/// Parses a port as nats-server takes it: 0-65535, or -1 for a random port.
pub fn parse_port(text: &str) -> Result<i32, String> {
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|port| (-1..=i32::from(u16::MAX)).contains(port))
        .ok_or_else(|| format!("`{text}` is not a port (0-65535, or -1 for a random port)"))
}

/// `host:port`, `[v6]:port`, or a bare port (the host then stays as it was).
fn parse_host_port(text: &str) -> Result<(Option<String>, i32), String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return parse_port(text).map(|port| (None, port));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("`{text}` has no host (expected host:port)"));
    }
    Ok((Some(host.to_owned()), parse_port(port)?))
}

fn parse_count<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a non-negative whole number"))
}

fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" => Ok(true),
        "false" | "no" | "off" => Ok(false),
        _ => Err(format!("`{text}` is not a boolean (true or false)")),
    }
}

/// Checks a server name by nats-server's rule (non-empty, no whitespace): the name
/// travels in INFO and in monitoring output.
pub fn parse_server_name(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains(char::is_whitespace) {
        return Err("a server name must be non-empty and contain no spaces".to_owned());
    }
    Ok(text.to_owned())
}

/// A small hand-written scanner: the grammar is tiny, and it lets every error carry a
/// line number.
struct Lexer<'a> {
    rest: &'a str,
    line: usize,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        Lexer {
            rest: text,
            line: 1,
        }
    }

    fn error(&self, kind: ErrorKind) -> ConfError {
        ConfError {
            line: self.line,
            kind,
        }
    }

    fn peek(&self) -> Option<char> {
        self.rest.chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.rest = &self.rest[c.len_utf8()..];
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn skip_spaces(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\r')) {
            self.bump();
        }
    }

    fn at_comment(&self) -> bool {
        self.rest.starts_with('#') || self.rest.starts_with("//")
    }

    /// Skips whitespace, entry separators and comments between entries.
    fn skip_between_entries(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() || c == ',' || c == ';' => {
                    self.bump();
                }
                Some(_) if self.at_comment() => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    /// Reads entries until end of input (top level) or the `}` closing `block`, given as
    /// its name and the line it opened on (which is where an unclosed block is reported).
    fn entries(&mut self, block: Option<(&str, usize)>) -> Result<Vec<Entry>, ConfError> {
        let mut entries = Vec::new();
        loop {
            self.skip_between_entries();
            match (self.peek(), block) {
                (None, None) => return Ok(entries),
                (None, Some((name, line))) => {
                    let kind = ErrorKind::UnclosedBlock(name.to_owned());
                    return Err(ConfError { line, kind });
                }
                (Some('}'), Some(_)) => {
                    self.bump();
                    return Ok(entries);
                }
                (Some(_), _) => entries.push(self.entry()?),
            }
        }
    }

    fn entry(&mut self) -> Result<Entry, ConfError> {
        let line = self.line;
        let key_len = self
            .rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
            .unwrap_or(self.rest.len());
        if key_len == 0 {
            let c = self.peek().unwrap_or_default();
            return Err(self.error(ErrorKind::Unexpected(c)));
        }
        let key = self.rest[..key_len].to_ascii_lowercase();
        self.rest = &self.rest[key_len..];
        self.skip_spaces();
        if matches!(self.peek(), Some(':' | '=')) {
            self.bump();
            self.skip_spaces();
        }
        let value = match self.peek() {
            Some('{') => {
                self.bump();
                Value::Block(self.entries(Some((&key, line)))?)
            }
            Some(quote @ ('"' | '\'')) => {
                self.bump();
                let text = self.quoted(quote)?;
                self.expect_end_of_value()?;
                Value::Scalar(text)
            }
            Some('[') => return Err(self.error(ErrorKind::Unexpected('['))),
            None | Some('\n' | ',' | ';' | '}') => {
                return Err(self.error(ErrorKind::MissingValue(key)));
            }
            Some(_) if self.at_comment() => return Err(self.error(ErrorKind::MissingValue(key))),
            Some(_) => Value::Scalar(self.bare()),
        };
        Ok(Entry { key, line, value })
    }

    /// A bare value runs to whitespace, a separator, a closing brace or a comment; it may
    /// contain `:` so that `listen: 127.0.0.1:4222` needs no quotes.
    fn bare(&mut self) -> String {
        let len = self
            .rest
            .find(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '}' | '#'))
            .unwrap_or(self.rest.len());
        let text = self.rest[..len].to_owned();
        self.rest = &self.rest[len..];
        text
    }

    fn quoted(&mut self, quote: char) -> Result<String, ConfError> {
        let line = self.line;
        let unterminated = ConfError {
            line,
            kind: ErrorKind::UnterminatedString,
        };
        let mut text = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => return Err(unterminated),
                Some(c) if c == quote => return Ok(text),
                // Escapes only in double quotes, as in nats-server; single quotes are raw.
                Some('\\') if quote == '"' => match self.bump() {
                    Some('n') => text.push('\n'),
                    Some('t') => text.push('\t'),
                    Some('r') => text.push('\r'),
                    Some(c @ ('"' | '\\')) => text.push(c),
                    Some(c) => return Err(self.error(ErrorKind::Unexpected(c))),
                    None => return Err(unterminated),
                },
                Some(c) => text.push(c),
            }
        }
    }

    fn expect_end_of_value(&mut self) -> Result<(), ConfError> {
        self.skip_spaces();
        match self.peek() {
            None | Some('\n' | ',' | ';' | '}') => Ok(()),
            Some(_) if self.at_comment() => Ok(()),
            Some(c) => Err(self.error(ErrorKind::Unexpected(c))),
        }
    }
}

#[cfg(test)]
mod tests;
