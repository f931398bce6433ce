//! A child process whose log lines (stdout and stderr) are read as it writes them and
//! kept: a test waits for a line (never sleeps), reads the log, signals the process,
//! and drops it to kill it (by its own pid, only while it is still ours: not yet
//! reaped) and reap it. The log's last lines go into every failure message, and the
//! whole log can be written to a file as it comes ([`Process::tee_to`]).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufRead as _, BufReader, ErrorKind, Read, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, LazyLock, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::watch;

use crate::DEADLINE;

/// Lines of the log a failure message shows: a flooded log would drown it.
const TAIL_LINES: usize = 40;

/// A started child process; killed (by its own pid) and reaped when dropped.
pub struct Process {
    name: String,
    child: Child,
    log: watch::Receiver<Log>,
    /// The log's writing end (the pipes' readers hold it too), to start a tee.
    log_tx: Arc<watch::Sender<Log>>,
    /// Lines before this one have been waited past by [`Process::line`].
    next: usize,
    /// Files removed once the process is gone (its config file).
    temp_files: Vec<PathBuf>,
}

/// Everything the process wrote, line by line, with when it was read.
struct Log {
    lines: Vec<(Instant, String)>,
    /// Pipes not yet closed: none once the process has exited.
    open_pipes: usize,
    /// Where each line is also written as it is read ([`Process::tee_to`]).
    tee: Option<Tee>,
}

/// A file the log is written to, line by line.
struct Tee {
    path: PathBuf,
    file: File,
}

impl Log {
    fn push(&mut self, line: String) {
        if let Some(tee) = &mut self.tee
            && let Err(error) = tee.file.write_all(format!("{line}\n").as_bytes())
        {
            let path = tee.path.display();
            tracing::warn!(%path, %error, "cannot write a process's log: it is kept in memory only");
            self.tee = None;
        }
        self.lines.push((Instant::now(), line));
    }
}

impl Process {
    /// Starts `command` named `name` (for messages), with no stdin, its stdout and
    /// stderr read into the log, and none of the test's own `SHADDOCK_*` variables
    /// unless `command` sets them: a setting exported in the shell must not change
    /// what a test starts.
    pub fn spawn(name: &str, command: Command) -> Process {
        Process::try_spawn(name, command).unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
    }

    /// [`Process::spawn`] for a caller that is no test (the load tester): an error, not
    /// a panic, when the program cannot be started.
    pub fn try_spawn(name: &str, mut command: Command) -> std::io::Result<Process> {
        let set: Vec<OsString> = command.get_envs().map(|(k, _)| k.to_owned()).collect();
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("SHADDOCK_")) && !set.contains(&key) {
                command.env_remove(key);
            }
        }
        let mut command = tie(command)?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_from_one_thread(command)?;
        until_tied(&mut child)?;
        let (tx, log) = watch::channel(Log {
            lines: Vec::new(),
            open_pipes: 2,
            tee: None,
        });
        let tx = Arc::new(tx);
        read_lines(child.stdout.take().unwrap(), tx.clone());
        read_lines(child.stderr.take().unwrap(), tx.clone());
        Ok(Process {
            name: name.to_owned(),
            child,
            log,
            log_tx: tx,
            next: 0,
            temp_files: Vec::new(),
        })
    }

    /// Its name, as given to [`Process::spawn`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Removes `path` once the process is gone.
    pub fn remove_on_drop(&mut self, path: PathBuf) {
        self.temp_files.push(path);
    }

    /// The next line containing `needle` (after the one the last wait returned), within
    /// [`DEADLINE`]; panics with the log if the process ends or the deadline passes first.
    pub async fn line(&mut self, needle: &str) -> String {
        self.line_within(needle, DEADLINE).await
    }

    /// [`Process::line`] with a wait of the test's own (one that is part of what it
    /// checks).
    pub async fn line_within(&mut self, needle: &str, wait: Duration) -> String {
        self.wait_line(needle, wait)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Process::line_within`] that fails with the message (the log's tail in it)
    /// instead of panicking.
    pub async fn wait_line(&mut self, needle: &str, wait: Duration) -> Result<String, String> {
        let from = self.next;
        let mut found = None;
        let timed_out = tokio::time::timeout(
            wait,
            self.log.wait_for(|log| {
                found = log.lines[from..]
                    .iter()
                    .position(|(_, line)| line.contains(needle))
                    .map(|i| from + i);
                found.is_some() || log.open_pipes == 0
            }),
        )
        .await
        .is_err();
        if let Some(i) = found {
            self.next = i + 1;
            return Ok(self.log.borrow().lines[i].1.clone());
        }
        let how = if timed_out {
            "did not log in time"
        } else {
            "ended without logging"
        };
        Err(self.failure(&format!("{how} {needle:?}")))
    }

    /// The address in the next line containing `phrase`: the word right after it, with
    /// a wildcard host made loopback (where a client reaches it).
    pub async fn addr_after(&mut self, phrase: &str) -> SocketAddr {
        let line = self.line(phrase).await;
        let mut addr: SocketAddr = word_after(&line, phrase)
            .parse()
            .unwrap_or_else(|e| panic!("no address after {phrase:?} in {line:?}: {e}"));
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        addr
    }

    /// Writes the log to `path` (its directory made if need be): what it logged so far
    /// at once, then each line as it is read. So the file holds the log up to the last
    /// line even if whoever started the process is killed before it can stop it.
    pub fn tee_to(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = File::create(path)?;
        let mut written = Ok(());
        // Under the log's lock: no line is read between the copy and the tee.
        self.log_tx.send_modify(|log| {
            let so_far: String = log.lines.iter().map(|(_, l)| format!("{l}\n")).collect();
            written = file.write_all(so_far.as_bytes());
            if written.is_ok() {
                log.tee = Some(Tee {
                    path: path.to_owned(),
                    file,
                });
            }
        });
        written
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        let log = self.log.borrow();
        let lines: Vec<&str> = log.lines.iter().map(|(_, l)| l.as_str()).collect();
        lines.join("\n")
    }

    /// How many lines containing `needle` it logged since `since`.
    pub fn count_since(&self, since: Instant, needle: &str) -> usize {
        let log = self.log.borrow();
        log.lines
            .iter()
            .filter(|(at, line)| *at >= since && line.contains(needle))
            .count()
    }

    /// Sends `signal`, unless the process has already been reaped: only then could its
    /// pid be someone else's.
    pub fn signal(&mut self, signal: Signal) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let pid = Pid::from_raw(i32::try_from(self.pid()).unwrap());
            kill(pid, signal).unwrap_or_else(|e| panic!("{signal} to {}: {e}", self.name));
        }
    }

    /// Waits, within [`DEADLINE`], for the process to exit on its own (it closes its
    /// pipes as it does) and returns how it exited.
    pub async fn exit(&mut self) -> ExitStatus {
        match self.exit_within(DEADLINE).await {
            Some(status) => status,
            None => panic!("{}", self.failure("did not exit in time")),
        }
    }

    /// How it exited, once it has within `wait`; `None` if it is still running.
    async fn exit_within(&mut self, wait: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(wait, self.exited()).await.ok()?;
        self.child.wait().ok()
    }

    /// Resolves once the process has exited (it closes its pipes as it does).
    pub async fn exited(&self) {
        let mut log = self.log.clone();
        let _ = log.wait_for(|log| log.open_pipes == 0).await;
    }

    /// How it exited, if it has (without waiting).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal` and waits up to `wait` for the process to exit; then kills it and
    /// fails with its log's tail.
    pub async fn stop(&mut self, signal: Signal, wait: Duration) -> Result<ExitStatus, String> {
        self.signal(signal);
        if let Some(status) = self.exit_within(wait).await {
            return Ok(status);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(self.failure(&format!(
            "did not stop in time after {signal} and was killed"
        )))
    }

    /// `NAME (pid PID) WHAT; its log (...)`, the last lines of the log in it: what a
    /// failure says.
    pub fn failure(&self, what: &str) -> String {
        format!("{} (pid {}) {what}; {}", self.name, self.pid(), self.tail())
    }

    /// The last lines of the log, for a failure message.
    fn tail(&self) -> String {
        let log = self.log.borrow();
        let skip = log.lines.len().saturating_sub(TAIL_LINES);
        let tail: Vec<&str> = log.lines[skip..].iter().map(|(_, l)| l.as_str()).collect();
        format!("its log ({skip} earlier lines):\n{}", tail.join("\n"))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for path in &self.temp_files {
            // A file, or a directory the process kept its data in.
            let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path));
        }
    }
}

/// The program that ties a child to this process ([`tie`]): util-linux's `setpriv`,
/// in every Debian and Ubuntu.
const SETPRIV: &str = "setpriv";

/// `command` tied to this process: run by `setpriv --pdeathsig KILL`, which asks the
/// kernel to kill it (SIGKILL) once the thread that started it ends, and then runs the
/// program in its place (same pid); its arguments, environment and directory kept. So a
/// child dies with this process however it ends, SIGKILL included, when nothing of its
/// own can stop its children any more (a load tester killed midway, a test binary
/// killed at a timeout). Started from [`spawn_from_one_thread`], as it must be. A
/// program that cannot be found fails here, as a spawn of it would. Without `setpriv`,
/// `command` itself, untied, and that is said once.
fn tie(command: Command) -> std::io::Result<Command> {
    static HAS_SETPRIV: LazyLock<bool> = LazyLock::new(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = on_path(Path::new(SETPRIV), &path).is_some();
        if !found {
            eprintln!(
                "testkit: no `{SETPRIV}` (util-linux): the processes started here outlive \
                 this one if it is killed"
            );
        }
        found
    });
    if !*HAS_SETPRIV {
        return Ok(command);
    }
    let mut tied = Command::new(SETPRIV);
    tied.args(["--pdeathsig", "KILL", "--"])
        .arg(locate(&command)?)
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => tied.env(key, value),
            None => tied.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        tied.current_dir(dir);
    }
    Ok(tied)
}

/// Where `command`'s program is, as its spawn would look: a path as given (from the
/// command's directory if relative), a bare name on the `PATH` it runs with. Not there
/// or not executable: the error its spawn would give.
fn locate(command: &Command) -> std::io::Result<PathBuf> {
    let program = Path::new(command.get_program());
    let found = if program.components().count() > 1 {
        let dir = command.get_current_dir().unwrap_or(Path::new(""));
        Some(dir.join(program)).filter(|path| runnable(path))
    } else {
        let path = match command.get_envs().find(|(key, _)| *key == "PATH") {
            Some((_, path)) => path.map(OsStr::to_owned),
            None => std::env::var_os("PATH"),
        };
        path.and_then(|path| on_path(program, &path))
    };
    found.ok_or_else(|| {
        let program = program.display();
        std::io::Error::new(ErrorKind::NotFound, format!("{program}: no such program"))
    })
}

/// The first runnable `name` in the directories of `path` (a `PATH` value).
pub(crate) fn on_path(name: &Path, path: &OsStr) -> Option<PathBuf> {
    (std::env::split_paths(path))
        .map(|dir| dir.join(name))
        .find(|candidate| runnable(candidate))
}

/// Whether `path` is a file this user may run.
fn runnable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Waits until `child` runs its program, no longer `setpriv` ([`tie`]): until then it
/// may not have asked for the signal yet, and a parent killed then leaves it running.
/// One that ended meanwhile waits for nothing; one stuck past [`DEADLINE`] is killed.
fn until_tied(child: &mut Child) -> std::io::Result<()> {
    let exe = format!("/proc/{}/exe", child.id());
    let started = Instant::now();
    while std::fs::read_link(&exe).is_ok_and(|path| path.ends_with(SETPRIV)) {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "{SETPRIV} did not run its program within {DEADLINE:?}"
            )));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(())
}

/// Starts `command` from one thread that lives as long as this process: the
/// parent-death signal [`tie`] sets fires when the *thread* that started the child ends,
/// and a test's thread or a runtime's ends while the process lives.
fn spawn_from_one_thread(command: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::SyncSender<std::io::Result<Child>>);
    static SPAWNER: LazyLock<mpsc::Sender<Job>> = LazyLock::new(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let spawner = std::thread::Builder::new().name("testkit-spawner".into());
        spawner
            .spawn(move || {
                // The sender is a static's: the queue never ends, nor this thread.
                for (mut command, started) in queue {
                    let _ = started.send(command.spawn());
                }
            })
            .expect("cannot start the thread processes are started from");
        jobs
    });
    let gone = || std::io::Error::other("the thread processes are started from is gone");
    let (started, child) = mpsc::sync_channel(1);
    SPAWNER.send((command, started)).map_err(|_| gone())?;
    child.recv().map_err(|_| gone())?
}

/// Reads `pipe` into the log line by line until it closes, on a thread of its own so
/// the child never blocks on a full pipe, with or without a runtime.
fn read_lines(pipe: impl Read + Send + 'static, log: Arc<watch::Sender<Log>>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        // A read error ends the log the same as EOF does.
        while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            // Lossy: a log line is for people, and bad UTF-8 must not stop the reading.
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_owned();
            log.send_modify(|log| log.push(line));
            buf.clear();
        }
        log.send_modify(|log| log.open_pipes -= 1);
    });
}

/// The first whitespace-separated word after `phrase` in `line`; panics without one.
pub fn word_after<'a>(line: &'a str, phrase: &str) -> &'a str {
    find_word_after(line, phrase).unwrap_or_else(|| panic!("no word after {phrase:?} in {line:?}"))
}

/// [`word_after`], `None` without one.
pub(crate) fn find_word_after<'a>(line: &'a str, phrase: &str) -> Option<&'a str> {
    let (_, rest) = line.split_once(phrase)?;
    rest.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`the_parent_killed`] is told to do by [`a_child_dies_with_its_parent_even_killed`].
    const PARENT_ROLE: &str = "TESTKIT_PARENT_TO_KILL";

    /// A process that starts a child and is then killed by SIGKILL, which runs nothing
    /// of its own, leaves no child running: the kernel kills it.
    #[tokio::test]
    async fn a_child_dies_with_its_parent_even_killed() {
        let mut parent = Command::new(std::env::current_exe().unwrap());
        parent
            .args(["process::tests::the_parent_killed", "--exact", "--ignored"])
            .args(["--nocapture", "--test-threads=1"])
            .env(PARENT_ROLE, "1");
        let mut parent = Process::spawn("the parent", parent);
        let line = parent.line("child pid").await;
        let child = Pid::from_raw(word_after(&line, "child pid").parse().unwrap());
        let running = |pid| state_of(pid).is_some_and(|state| state != 'Z');
        assert!(
            running(child),
            "the child ended with the thread that started it"
        );
        parent.signal(Signal::SIGKILL);
        parent.exited().await;
        let started = Instant::now();
        // Gone, or a zombie left for whoever it was handed to.
        while running(child) {
            if started.elapsed() > DEADLINE {
                let _ = kill(child, Signal::SIGKILL);
                panic!("child {child} outlived its parent, killed by SIGKILL");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The parent [`a_child_dies_with_its_parent_even_killed`] starts: starts a child
    /// from a thread that then ends (as a test's or a runtime's does), which must not
    /// end the child, says its pid, and waits to be killed. Run only by it.
    #[tokio::test]
    #[ignore = "the process a_child_dies_with_its_parent_even_killed starts and kills"]
    async fn the_parent_killed() {
        assert!(
            std::env::var_os(PARENT_ROLE).is_some(),
            "run by its test only"
        );
        let child = std::thread::spawn(|| {
            let mut sleep = Command::new("sleep");
            sleep.arg("600");
            Process::spawn("sleep", sleep)
        });
        let child = child.join().unwrap();
        println!("child pid {}", child.pid());
        std::future::pending::<()>().await;
    }

    /// A program that is not there fails the start at once, as a spawn of it would, on
    /// the `PATH` it runs with.
    #[test]
    fn a_program_not_found_is_an_error_at_once() {
        let error = Process::try_spawn("none", Command::new("testkit-no-such-program"));
        assert_eq!(error.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
        let mut sh = Command::new("sh");
        sh.env("PATH", "/nonexistent");
        let error = Process::try_spawn("sh", sh);
        assert_eq!(error.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
        let error = Process::try_spawn("none", Command::new("/nonexistent/sh"));
        assert_eq!(error.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
    }

    /// `pid`'s state letter (`S` sleeping, `Z` zombie...); `None` once it is gone.
    fn state_of(pid: Pid) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name, in parentheses, which may hold spaces.
        let (_, rest) = stat.rsplit_once(')')?;
        rest.trim_start().chars().next()
    }

    /// The file holds every line as soon as it is read, those logged before the tee
    /// included, while the process still runs.
    #[tokio::test]
    async fn a_tee_writes_the_lines_so_far_and_each_new_one_at_once() {
        let dir = std::env::temp_dir().join(format!("testkit-tee-{}", std::process::id()));
        let (flag, path) = (dir.join("go-on"), dir.join("logs").join("child.log"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new("sh");
        let script = format!(
            "echo one; while [ ! -e {} ]; do sleep 0.01; done; echo two; exec sleep 60",
            flag.display()
        );
        command.args(["-c", &script]);
        let mut child = Process::spawn("sh", command);
        child.line("one").await;
        child.tee_to(&path).unwrap();
        std::fs::write(&flag, "").unwrap();
        child.line("two").await;
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        drop(child);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
