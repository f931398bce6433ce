//! Flag parsing, flag-over-file merging, and the files a started broker leaves behind.

use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: BrokerArgs,
}

fn args(argv: &[&str]) -> BrokerArgs {
    match Cli::try_parse_from(std::iter::once("broker").chain(argv.iter().copied())) {
        Ok(cli) => cli.args,
        Err(error) => panic!("{argv:?} should parse: {error}"),
    }
}

fn settings(argv: &[&str]) -> Settings {
    match args(argv).merge(FileConfig::default()) {
        Ok(settings) => settings,
        Err(error) => panic!("{argv:?} should resolve: {error:#}"),
    }
}

fn resolve_error(argv: &[&str], file: FileConfig) -> String {
    match args(argv).merge(file) {
        Ok(settings) => panic!("{argv:?} should fail, got {settings:?}"),
        Err(error) => format!("{error:#}"),
    }
}

/// A directory of its own per test, under the system temp dir.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shaddock-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(error) = std::fs::create_dir_all(&dir) {
        panic!("creating {}: {error}", dir.display());
    }
    dir
}

#[test]
fn no_flags_give_nats_server_defaults() {
    let settings = settings(&[]);
    assert_eq!((settings.host.as_str(), settings.port), ("0.0.0.0", 4222));
    assert_eq!(settings.monitor, None);
    assert_eq!(settings.log_level, None);
    assert_eq!(settings.config.auth, Auth::None);
    assert_eq!(settings.config.max_payload, Config::default().max_payload);
}

#[test]
fn port_minus_one_binds_a_random_port() {
    assert_eq!(settings(&["-p", "-1"]).port, 0);
    assert_eq!(settings(&["--port=-1"]).port, 0);
    let monitored = settings(&["-p", "-1", "-m", "-1"]);
    assert_eq!(monitored.monitor, Some(("0.0.0.0".to_owned(), 0)));
}

#[test]
fn address_and_ports_as_harnesses_pass_them() {
    let settings = settings(&["-a", "127.0.0.1", "-p", "4333", "-m", "8333"]);
    assert_eq!((settings.host.as_str(), settings.port), ("127.0.0.1", 4333));
    assert_eq!(settings.monitor, Some(("127.0.0.1".to_owned(), 8333)));
    assert_eq!(args(&["--net", "::1"]).addr.as_deref(), Some("::1"));
    assert_eq!(
        args(&["--addr", "h", "--http_port", "1"]).http_port,
        Some(1)
    );
}

#[test]
fn bad_ports_are_rejected() {
    for port in ["70000", "-2", "abc"] {
        assert!(
            Cli::try_parse_from(["broker", "-p", port]).is_err(),
            "{port}"
        );
    }
}

#[test]
fn debug_and_trace_flags_combine() {
    assert_eq!(settings(&["-D"]).log_level, Some(Level::DEBUG));
    assert_eq!(settings(&["-V"]).log_level, Some(Level::TRACE));
    assert_eq!(settings(&["-DV"]).log_level, Some(Level::TRACE));
    assert_eq!(settings(&["-DVV"]).log_level, Some(Level::TRACE));
    assert_eq!(
        settings(&["--debug", "--trace"]).log_level,
        Some(Level::TRACE)
    );
}

#[test]
fn user_and_password_or_token_set_auth() {
    assert_eq!(
        settings(&["--user", "u", "--pass", "p"]).config.auth,
        Auth::UserPass {
            user: "u".into(),
            pass: "p".into()
        }
    );
    assert_eq!(
        settings(&["--auth", "s3cret"]).config.auth,
        Auth::Token("s3cret".into())
    );
}

#[test]
fn incomplete_or_mixed_credentials_are_refused() {
    let file = FileConfig::default;
    assert!(resolve_error(&["--user", "u"], file()).contains("needs a password"));
    assert!(resolve_error(&["--pass", "p"], file()).contains("needs a user"));
    let mixed = resolve_error(&["--user", "u", "--pass", "p", "--auth", "t"], file());
    assert!(mixed.contains("either a token or a user"));
}

#[test]
fn tls_from_flags_or_the_file_block_flags_first() {
    let pki = crate::testing::pki::Pki::new();
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (cert, key, ca) = (path(&pki.server.cert), path(&pki.server.key), path(&pki.ca));
    let plain = settings(&["--tls", "--tlscert", &cert, "--tlskey", &key]);
    let tls = plain.config.tls.expect("TLS on");
    assert!(!tls.verify());
    assert_eq!(tls.timeout(), DEFAULT_TLS_TIMEOUT);
    assert!(settings(&[]).config.tls.is_none());

    let file = FileConfig {
        tls: Some(TlsBlock {
            cert_file: Some(pki.server.cert.clone()),
            key_file: Some(pki.server.key.clone()),
            timeout: Some(Duration::from_secs(1)),
            ..TlsBlock::default()
        }),
        ..FileConfig::default()
    };
    let verifying = args(&["--tlsverify", "--tlscacert", &ca, "--tls_timeout", "500ms"])
        .merge(file)
        .unwrap();
    let tls = verifying.config.tls.expect("TLS on");
    assert!(tls.verify());
    assert_eq!(tls.timeout(), Duration::from_millis(500));
}

#[test]
fn incomplete_tls_settings_are_refused() {
    for (argv, expected) in [
        (&["--tlscert", "c.pem"][..], "without --tls"),
        (&["--tls"], "server certificate"),
        (&["--tls", "--tlscert", "c.pem"], "private key"),
        (&["--tlsverify", "--tlscert", "c", "--tlskey", "k"], "CA"),
        (
            &[
                "--tls",
                "--tlscert",
                "c",
                "--tlskey",
                "k",
                "--tls_timeout",
                "0",
            ],
            "tls_timeout",
        ),
        (
            &["--tls", "--tlscert", "/no/such.pem", "--tlskey", "k"],
            "/no/such.pem",
        ),
    ] {
        let error = resolve_error(argv, FileConfig::default());
        assert!(error.contains(expected), "{argv:?}: {error}");
    }
}

#[test]
fn names_paths_and_limits_are_configurable() {
    let settings = settings(&[
        "-n",
        "edge-1",
        "-l",
        "/tmp/b.log",
        "-P",
        "/tmp/b.pid",
        "--ports_file_dir",
        "/tmp",
        "--max_payload",
        "2MB",
        "--max_connections",
        "10",
        "--max_control_line",
        "8KB",
        "--max_pending",
        "100MB",
        "--max_subscriptions",
        "5",
        "--ping_interval",
        "2m",
        "--ping_max",
        "3",
        "--write_deadline",
        "5",
        "--auth_timeout",
        "500ms",
    ]);
    assert_eq!(settings.config.server_name.as_deref(), Some("edge-1"));
    assert_eq!(settings.log_file, Some(PathBuf::from("/tmp/b.log")));
    assert_eq!(settings.pid_file, Some(PathBuf::from("/tmp/b.pid")));
    assert_eq!(settings.ports_file_dir, Some(PathBuf::from("/tmp")));
    let config = &settings.config;
    assert_eq!(config.max_payload, 2 << 20);
    assert_eq!(config.max_connections, 10);
    assert_eq!(config.max_control_line, 8 << 10);
    assert_eq!(config.max_pending, 100 << 20);
    assert_eq!(config.max_subscriptions, 5);
    assert_eq!(config.ping_interval, Duration::from_secs(120));
    assert_eq!(config.max_pings_out, 3);
    assert_eq!(config.write_deadline, Duration::from_secs(5));
    assert_eq!(config.auth_timeout, Duration::from_millis(500));
    assert_eq!(args(&["--server_name", "x"]).name.as_deref(), Some("x"));
}

#[test]
fn unusable_limits_are_refused() {
    let file = FileConfig::default;
    let too_big = resolve_error(&["--max_payload", "2MB", "--max_pending", "1MB"], file());
    assert!(too_big.contains("max_payload"), "{too_big}");
    assert!(resolve_error(&["--ping_interval", "0"], file()).contains("ping_interval"));
    assert!(resolve_error(&["--max_connections", "0"], file()).contains("max_connections"));
}

#[test]
fn flags_override_the_config_file() {
    let file = match conf_file::parse(
        "listen: 10.0.0.1:1111\nhttp_port: 2222\nserver_name: file\nmax_payload: 1KB\n\
         ping_interval: 5\nauthorization { token: file-token, timeout: 3 }\ndebug: true\n\
         flow_control_pending: 256KB\nstall_window: 1s",
    ) {
        Ok(file) => file,
        Err(error) => panic!("{error}"),
    };
    let flags = args(&[
        "-p",
        "3333",
        "-n",
        "flag",
        "--user",
        "u",
        "--pass",
        "p",
        "--stall_window",
        "2s",
    ]);
    let settings = match flags.merge(file) {
        Ok(settings) => settings,
        Err(error) => panic!("{error:#}"),
    };
    assert_eq!(settings.port, 3333);
    assert_eq!(
        settings.host, "10.0.0.1",
        "unset flags keep the file's value"
    );
    assert_eq!(settings.monitor, Some(("10.0.0.1".to_owned(), 2222)));
    assert_eq!(settings.config.server_name.as_deref(), Some("flag"));
    assert_eq!(settings.config.max_payload, 1024);
    assert_eq!(settings.config.ping_interval, Duration::from_secs(5));
    assert_eq!(settings.config.flow_control_pending, 256 << 10);
    assert_eq!(
        settings.config.stall_window,
        Duration::from_secs(2),
        "the flag wins over the file"
    );
    assert_eq!(
        settings.config.auth,
        Auth::UserPass {
            user: "u".into(),
            pass: "p".into()
        },
        "flag credentials replace the file's token"
    );
    assert_eq!(settings.config.auth_timeout, Duration::from_secs(3));
    assert_eq!(settings.log_level, Some(Level::DEBUG));
}

#[test]
fn a_bad_config_file_error_names_the_file_and_line() {
    let dir = scratch_dir("badconf");
    let path = dir.join("broker.conf");
    if let Err(error) = std::fs::write(&path, "port: 4222\nclustr { }\n") {
        panic!("{error}");
    }
    let path_arg = path.to_string_lossy().into_owned();
    let message = match args(&["-c", &path_arg]).resolve() {
        Ok(settings) => panic!("should fail, got {settings:?}"),
        Err(error) => format!("{error:#}"),
    };
    assert!(message.contains(&path_arg), "{message}");
    assert!(
        message.contains("line 2: unknown key `clustr`"),
        "{message}"
    );
    let missing = args(&["-c", "/nonexistent/broker.conf"]).resolve();
    assert!(missing.is_err_and(|error| format!("{error:#}").contains("/nonexistent/broker.conf")));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ports_file_lists_dialable_urls() {
    let wildcard = SocketAddr::from(([0, 0, 0, 0], 4222));
    let monitor = SocketAddr::from(([127, 0, 0, 2], 8222));
    assert_eq!(
        ports_json(wildcard, Some(monitor)).ok().as_deref(),
        Some(r#"{"nats":["nats://127.0.0.1:4222"],"monitoring":["http://127.0.0.2:8222"]}"#)
    );
    let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 4222));
    assert_eq!(
        ports_json(v6, None).ok().as_deref(),
        Some(r#"{"nats":["nats://[::1]:4222"]}"#)
    );
}

#[tokio::test]
async fn a_started_broker_writes_pid_and_ports_files_and_removes_them() {
    let dir = scratch_dir("files");
    let pid_file = dir.join("broker.pid");
    let settings = Settings {
        pid_file: Some(pid_file.clone()),
        ports_file_dir: Some(dir.clone()),
        ..settings(&["-a", "127.0.0.1", "-p", "-1", "-m", "-1"])
    };
    let shutdown = CancellationToken::new();
    let broker = match Broker::start(&settings, shutdown.clone()).await {
        Ok(broker) => broker,
        Err(error) => panic!("{error:#}"),
    };
    let client = broker.client_addr();
    assert_ne!(client.port(), 0, "the real port is reported");
    let Some(monitor) = broker.monitor_addr() else {
        panic!("monitoring was asked for");
    };
    let ports_file = dir.join(ports_file_name());
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read(&pid_file), std::process::id().to_string());
    let expected = format!(r#"{{"nats":["nats://{client}"],"monitoring":["http://{monitor}"]}}"#);
    assert_eq!(read(&ports_file), expected);
    assert!(tokio::net::TcpStream::connect(client).await.is_ok());

    shutdown.cancel();
    let stopped = broker.stop().await;
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(
        !pid_file.exists() && !ports_file.exists(),
        "files are removed on exit"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn defaults_stated_in_help_match_the_config() {
    // `--help` states these defaults in prose; when one changes, update the help text.
    let config = Config::default();
    assert_eq!(config.max_payload, 1 << 20);
    assert_eq!(config.max_connections, 65_536);
    assert_eq!(config.max_control_line, 4 << 10);
    assert_eq!(config.max_pending, 64 << 20);
    assert_eq!(config.max_subscriptions, 0);
    assert_eq!(config.ping_interval, Duration::from_secs(120));
    assert_eq!(config.max_pings_out, 2);
    assert_eq!(config.write_deadline, Duration::from_secs(10));
    assert_eq!(config.auth_timeout, Duration::from_secs(2));
    assert_eq!(config.lame_duck_duration, Duration::from_secs(120));
    assert_eq!(config.lame_duck_grace_period, Duration::from_secs(10));
}

#[test]
fn lame_duck_timings_from_flags_over_the_file() {
    let defaults = settings(&[]).config;
    assert_eq!(defaults.lame_duck_duration, Duration::from_secs(120));
    assert_eq!(defaults.lame_duck_grace_period, Duration::from_secs(10));
    let file = FileConfig {
        lame_duck_duration: Some(Duration::from_secs(60)),
        lame_duck_grace_period: Some(Duration::from_secs(5)),
        ..FileConfig::default()
    };
    let from_file = args(&[]).merge(file.clone()).unwrap().config;
    assert_eq!(from_file.lame_duck_duration, Duration::from_secs(60));
    assert_eq!(from_file.lame_duck_grace_period, Duration::from_secs(5));
    let flags = [
        "--lame-duck-duration",
        "1s",
        "--lame_duck_grace_period",
        "200ms",
    ];
    let from_flags = args(&flags).merge(file).unwrap().config;
    assert_eq!(from_flags.lame_duck_duration, Duration::from_secs(1));
    assert_eq!(
        from_flags.lame_duck_grace_period,
        Duration::from_millis(200)
    );
}

#[test]
fn a_grace_period_must_end_before_the_lame_duck_duration() {
    let file = FileConfig::default;
    let equal = [
        "--lame-duck-duration",
        "1s",
        "--lame-duck-grace-period",
        "1s",
    ];
    let error = resolve_error(&equal, file());
    assert!(error.contains("lame_duck_grace_period"), "{error}");
    // Just shorter is fine, and a zero duration (close at once) takes any grace period.
    settings(&[
        "--lame-duck-duration",
        "1s",
        "--lame-duck-grace-period",
        "999ms",
    ]);
    settings(&[
        "--lame-duck-duration",
        "0",
        "--lame-duck-grace-period",
        "5s",
    ]);
    settings(&["--lame-duck-duration", "0", "--lame-duck-grace-period", "0"]);
}

#[test]
fn the_listen_backlog_defaults_to_1024_and_refuses_0() {
    assert_eq!(
        settings(&[]).listen_backlog.get(),
        net::DEFAULT_LISTEN_BACKLOG
    );
    let set = settings(&["--listen-backlog", "4096"]);
    assert_eq!(set.listen_backlog.get(), 4096);
    let zero = Cli::try_parse_from(["broker", "--listen-backlog", "0"]).unwrap_err();
    assert!(zero.to_string().contains("at least 1"), "{zero}");
}
