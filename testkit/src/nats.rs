//! A NATS server as a child process, started the way NATS client test suites start
//! nats-server: `-a 127.0.0.1 -p -1`, the port read from the `Listening for client
//! connections on HOST:PORT` line, up once it logs `Server is ready`. Our `broker`
//! binary takes the same flags and logs the same lines, so it starts the same way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::on_path;
use crate::{Process, temp_file};

/// A NATS server process on a random port; killed and reaped when dropped.
pub struct NatsServer {
    pub process: Process,
    /// Its client port.
    pub addr: SocketAddr,
    /// `nats://HOST:PORT`, for any NATS client.
    pub url: String,
}

impl NatsServer {
    /// The real nats-server with its default configuration.
    pub async fn start() -> NatsServer {
        NatsServer::start_binary(&nats_server_path(), &[]).await
    }

    /// The real nats-server with a config file holding `config` (nats-server syntax);
    /// the file is removed when the server is dropped.
    pub async fn with_config(config: &str) -> NatsServer {
        NatsServer::binary_with_config(&nats_server_path(), config).await
    }

    /// [`NatsServer::with_config`] for `binary`: nats-server or our broker, which reads
    /// the same config files.
    pub async fn binary_with_config(binary: &Path, config: &str) -> NatsServer {
        let path = temp_file("nats-server.conf", config);
        let mut process = spawn(binary, &["-c", path.to_str().unwrap()]);
        process.remove_on_drop(path);
        NatsServer::ready(process).await
    }

    /// `binary -a 127.0.0.1 -p -1 ARGS`, where `binary` is nats-server or our broker.
    pub async fn start_binary(binary: &Path, args: &[&str]) -> NatsServer {
        NatsServer::ready(spawn(binary, args)).await
    }

    async fn ready(mut process: Process) -> NatsServer {
        let addr = process
            .addr_after("Listening for client connections on ")
            .await;
        process.line("Server is ready").await;
        NatsServer {
            process,
            addr,
            url: format!("nats://{addr}"),
        }
    }
}

fn spawn(binary: &Path, args: &[&str]) -> Process {
    let mut command = Command::new(binary);
    command.args(["-a", "127.0.0.1", "-p", "-1"]).args(args);
    let name = binary.file_name().unwrap_or_default().to_string_lossy();
    Process::spawn(&name, command)
}

/// The real nats-server: on PATH, else in `$(go env GOPATH)/bin`.
pub fn nats_server_path() -> PathBuf {
    find_go_binary("nats-server")
}

/// A Go-installed tool (`nats-server`, `nats-bench`, `nats-pub`, ...): on PATH, else in
/// `$(go env GOPATH)/bin`. Panics with a hint when it is not installed.
pub fn find_go_binary(name: &str) -> PathBuf {
    go_binary(name).unwrap_or_else(|| {
        panic!(
            "{name} not found on PATH or in $(go env GOPATH)/bin; install it with `go install` \
             (nats-server: `go install github.com/nats-io/nats-server/v2@latest`)"
        )
    })
}

/// [`find_go_binary`], `None` when it is not installed.
pub fn go_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) = on_path(Path::new(name), &path) {
        return Some(found);
    }
    let gopath = Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())?;
    // GOPATH may be a list; the first entry is where `go install` puts binaries.
    let first = std::env::split_paths(&gopath).next().unwrap_or_default();
    Some(first.join("bin").join(name)).filter(|candidate| candidate.is_file())
}
