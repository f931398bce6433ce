//! One test per key form and per error the config reader reports.

use super::*;

fn parse_ok(text: &str) -> FileConfig {
    match parse(text) {
        Ok(config) => config,
        Err(error) => panic!("{text:?} should parse: {error}"),
    }
}

fn parse_err(text: &str) -> ConfError {
    match parse(text) {
        Ok(config) => panic!("{text:?} should fail, parsed {config:?}"),
        Err(error) => error,
    }
}

#[test]
fn empty_and_comment_only_files_give_defaults() {
    assert_eq!(parse_ok(""), FileConfig::default());
    assert_eq!(parse_ok("# nothing\n// here\n\n"), FileConfig::default());
}

#[test]
fn colon_equals_and_space_separators_all_work() {
    for text in [
        "port: 4333",
        "port = 4333",
        "port 4333",
        "port:4333",
        "PORT=4333",
    ] {
        assert_eq!(parse_ok(text).port, Some(4333), "{text}");
    }
}

#[test]
fn entries_may_be_separated_by_commas_semicolons_or_newlines() {
    let config = parse_ok("host: 127.0.0.1, port: 1; max_payload: 10\r\nping_max 3");
    assert_eq!(config.host.as_deref(), Some("127.0.0.1"));
    assert_eq!(config.port, Some(1));
    assert_eq!(config.max_payload, Some(10));
    assert_eq!(config.ping_max, Some(3));
}

#[test]
fn comments_end_at_the_newline() {
    let config = parse_ok("# top\nport: 5 # trailing\n// slashes\nhost: \"a#b\" // after");
    assert_eq!(config.port, Some(5));
    assert_eq!(config.host.as_deref(), Some("a#b"));
}

#[test]
fn quoted_and_bare_strings() {
    assert_eq!(
        parse_ok("server_name: \"n1\"").server_name.as_deref(),
        Some("n1")
    );
    assert_eq!(
        parse_ok("server_name: 'n2'").server_name.as_deref(),
        Some("n2")
    );
    assert_eq!(
        parse_ok("server_name: n3").server_name.as_deref(),
        Some("n3")
    );
    let auth = parse_ok(r#"authorization { password: "a \"b\" \\c" }"#).authorization;
    assert_eq!(auth.password.as_deref(), Some(r#"a "b" \c"#));
    let raw = parse_ok(r"authorization { password: 'a\b' }").authorization;
    assert_eq!(raw.password.as_deref(), Some(r"a\b"));
}

#[test]
fn host_and_net_are_synonyms() {
    assert_eq!(parse_ok("net: 10.0.0.1").host.as_deref(), Some("10.0.0.1"));
    assert_eq!(parse_ok("host: ::1").host.as_deref(), Some("::1"));
}

#[test]
fn port_minus_one_means_random() {
    assert_eq!(parse_ok("port: -1").port, Some(-1));
    assert_eq!(parse_ok("http_port: -1").http_port, Some(-1));
}

#[test]
fn listen_sets_host_and_port() {
    let config = parse_ok("listen: 127.0.0.1:4333");
    assert_eq!(
        (config.host.as_deref(), config.port),
        (Some("127.0.0.1"), Some(4333))
    );
    let v6 = parse_ok("listen: \"[::1]:4334\"");
    assert_eq!((v6.host.as_deref(), v6.port), (Some("::1"), Some(4334)));
    let port_only = parse_ok("host: h\nlisten: 4335");
    assert_eq!(
        (port_only.host.as_deref(), port_only.port),
        (Some("h"), Some(4335))
    );
}

#[test]
fn monitoring_keys() {
    assert_eq!(parse_ok("http_port: 8222").http_port, Some(8222));
    assert_eq!(parse_ok("monitor_port: 8223").http_port, Some(8223));
    let http = parse_ok("http: 127.0.0.1:8224");
    assert_eq!(
        (http.http_host.as_deref(), http.http_port),
        (Some("127.0.0.1"), Some(8224))
    );
    assert_eq!(parse_ok("http: 8225").http_port, Some(8225));
}

#[test]
fn limits_accept_numbers_and_sizes() {
    let config = parse_ok(
        "max_payload: 1MB\nmax_control_line: 4KB\nmax_pending: 64MB\n\
         max_connections: 100\nmax_subscriptions: 7\nping_max: 4",
    );
    assert_eq!(config.max_payload, Some(1 << 20));
    assert_eq!(config.max_control_line, Some(4096));
    assert_eq!(config.max_pending, Some(64 << 20));
    assert_eq!(config.max_connections, Some(100));
    assert_eq!(config.max_subscriptions, Some(7));
    assert_eq!(config.ping_max, Some(4));
    assert_eq!(parse_ok("max_conn: 5").max_connections, Some(5));
    assert_eq!(parse_ok("max_subs: 6").max_subscriptions, Some(6));
}

#[test]
fn sizes_follow_nats_suffixes() {
    assert_eq!(parse_size("1024"), Ok(1024));
    assert_eq!(parse_size("64KB"), Ok(64 * 1024));
    assert_eq!(parse_size("64kib"), Ok(64 * 1024));
    assert_eq!(parse_size("1k"), Ok(1000));
    assert_eq!(parse_size("2M"), Ok(2_000_000));
    assert_eq!(parse_size("2MiB"), Ok(2 << 20));
    assert_eq!(parse_size("1GB"), Ok(1 << 30));
    assert!(parse_size("1XB").is_err());
    assert!(parse_size("MB").is_err());
    assert!(parse_size("-1").is_err());
    assert!(parse_size("99999999999999999999TB").is_err());
}

#[test]
fn duration_keys() {
    let config = parse_ok("ping_interval: \"2m\"\nwrite_deadline: \"10s\"");
    assert_eq!(config.ping_interval, Some(Duration::from_secs(120)));
    assert_eq!(config.write_deadline, Some(Duration::from_secs(10)));
    assert_eq!(
        parse_ok("ping_interval: 30").ping_interval,
        Some(Duration::from_secs(30))
    );
    let lame_duck = parse_ok("lame_duck_duration: \"30s\"\nlame_duck_grace_period: \"500ms\"");
    assert_eq!(lame_duck.lame_duck_duration, Some(Duration::from_secs(30)));
    assert_eq!(
        lame_duck.lame_duck_grace_period,
        Some(Duration::from_millis(500))
    );
}

#[test]
fn authorization_block_in_all_spellings() {
    let expected = Authorization {
        user: Some("a".into()),
        password: Some("b".into()),
        token: Some("t".into()),
        timeout: Some(Duration::from_secs(2)),
    };
    for text in [
        "authorization { user: a, password: b, token: t, timeout: 2 }",
        "authorization: {\n  user = a\n  pass = \"b\"\n  token t\n  timeout: \"2s\"\n}",
        "Authorization {username: a; password: b; token: t; timeout: 2}",
    ] {
        assert_eq!(parse_ok(text).authorization, expected, "{text}");
    }
}

#[test]
fn tls_block_holds_nats_server_keys() {
    let tls = parse_ok(
        "tls {\n  cert_file: \"/etc/b/server.pem\"\n  key_file: /etc/b/key.pem\n  \
         ca_file: ca.pem\n  verify: true\n  timeout: 0.5\n}",
    )
    .tls;
    let expected = TlsBlock {
        cert_file: Some("/etc/b/server.pem".into()),
        key_file: Some("/etc/b/key.pem".into()),
        ca_file: Some("ca.pem".into()),
        verify: Some(true),
        timeout: Some(Duration::from_millis(500)),
    };
    assert_eq!(tls, Some(expected));
    assert_eq!(parse_ok("tls {}").tls, Some(TlsBlock::default()));
    assert_eq!(parse_ok("port: 1").tls, None);
    let unknown = parse_err("tls {\n  cipher_suites: x\n}");
    assert_eq!(unknown.line, 2);
    assert_eq!(
        unknown.kind,
        ErrorKind::UnknownKey("tls.cipher_suites".into())
    );
    assert_eq!(
        parse_err("tls: yes").kind,
        ErrorKind::ExpectedBlock("tls".into())
    );
}

#[test]
fn paths_and_switches() {
    let config = parse_ok(
        "logfile: /tmp/b.log\npid_file: \"/tmp/b.pid\"\nports_file_dir: /tmp\n\
         debug: true\ntrace: false",
    );
    assert_eq!(config.log_file, Some(PathBuf::from("/tmp/b.log")));
    assert_eq!(config.pid_file, Some(PathBuf::from("/tmp/b.pid")));
    assert_eq!(config.ports_file_dir, Some(PathBuf::from("/tmp")));
    assert_eq!((config.debug, config.trace), (Some(true), Some(false)));
    assert_eq!(parse_ok("log_file: x").log_file, Some(PathBuf::from("x")));
}

#[test]
fn a_later_key_overrides_an_earlier_one() {
    assert_eq!(parse_ok("port: 1\nport: 2").port, Some(2));
}

#[test]
fn unknown_keys_name_the_key_and_line() {
    let error = parse_err("port: 1\n\njetstream: true");
    assert_eq!(error.line, 3);
    assert_eq!(error.kind, ErrorKind::UnknownKey("jetstream".into()));
    assert_eq!(error.to_string(), "line 3: unknown key `jetstream`");
    let nested = parse_err("authorization {\n  users: x\n}");
    assert_eq!(nested.line, 2);
    assert_eq!(
        nested.kind,
        ErrorKind::UnknownKey("authorization.users".into())
    );
}

#[test]
fn invalid_values_name_the_key_and_line() {
    for (text, key) in [
        ("\nport: 70000", "port"),
        ("\nport: abc", "port"),
        ("\nmax_payload: lots", "max_payload"),
        ("\nmax_connections: -5", "max_connections"),
        ("\nping_interval: soon", "ping_interval"),
        ("\ndebug: maybe", "debug"),
        ("\nlisten: :4222", "listen"),
        ("\nserver_name: \"a b\"", "server_name"),
    ] {
        let error = parse_err(text);
        assert_eq!(error.line, 2, "{text}");
        assert!(
            matches!(&error.kind, ErrorKind::InvalidValue { key: k, .. } if k == key),
            "{text}: {error}"
        );
    }
}

#[test]
fn syntax_errors_carry_their_line() {
    let cases = [
        ("port:", ErrorKind::MissingValue("port".into()), 1),
        ("port: # none", ErrorKind::MissingValue("port".into()), 1),
        ("\nhost: \"open\nport: 1", ErrorKind::UnterminatedString, 2),
        (
            "\nauthorization {\n user: a\n",
            ErrorKind::UnclosedBlock("authorization".into()),
            2,
        ),
        ("port: 1\n}", ErrorKind::Unexpected('}'), 2),
        ("= 5", ErrorKind::Unexpected('='), 1),
        ("host: [a, b]", ErrorKind::Unexpected('['), 1),
        ("host: \"a\"b", ErrorKind::Unexpected('b'), 1),
        ("host: \"a\\q\"", ErrorKind::Unexpected('q'), 1),
    ];
    for (text, kind, line) in cases {
        assert_eq!(parse_err(text), ConfError { line, kind }, "{text}");
    }
}

#[test]
fn blocks_and_scalars_are_not_interchangeable() {
    assert_eq!(
        parse_err("authorization: none").kind,
        ErrorKind::ExpectedBlock("authorization".into())
    );
    assert_eq!(
        parse_err("port { x: 1 }").kind,
        ErrorKind::UnexpectedBlock("port".into())
    );
}
