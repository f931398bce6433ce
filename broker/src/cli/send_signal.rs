//! `--signal SIGNAL=PID` (nats-server's `--signal`/`-sl`): signals a running broker, or
//! nats-server, and exits. PID may also be the path of a pid file (`--pid`).

use anyhow::{Context as _, bail};

/// The signals `--signal` sends, by nats-server's command names. `reopen` and `reload`
/// are nats-server's too, but this broker has neither log reopening nor config reload.
const COMMANDS: &[(&str, Command)] = &[
    ("ldm", Command::LameDuck),
    ("quit", Command::Quit),
    ("term", Command::Term),
    ("stop", Command::Stop),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    /// SIGUSR2: lame duck mode.
    LameDuck,
    /// SIGINT: stop at once.
    Quit,
    /// SIGTERM: stop, after lame duck mode if one runs.
    Term,
    /// SIGKILL.
    Stop,
}

/// Parses `SIGNAL=PID` or `SIGNAL=PIDFILE` and sends the signal.
pub fn send(arg: &str) -> anyhow::Result<()> {
    let (command, pid) = parse(arg)?;
    kill(pid, command).with_context(|| format!("signal {arg:?} to process {pid}"))
}

fn parse(arg: &str) -> anyhow::Result<(Command, i32)> {
    let mut parts = arg.split('=');
    let name = parts.next().unwrap_or_default();
    let target = parts.next();
    if let Some(rest) = parts.next() {
        bail!("invalid --signal {arg:?}: more than one `=` (before {rest:?})");
    }
    let Some(&(_, command)) = COMMANDS.iter().find(|(known, _)| *known == name) else {
        let known: Vec<&str> = COMMANDS.iter().map(|(known, _)| *known).collect();
        bail!(
            "unknown signal {name:?} (this broker supports {})",
            known.join(", ")
        );
    };
    let Some(target) = target.filter(|t| !t.is_empty()) else {
        bail!("--signal needs the process: {name}=PID or {name}=PIDFILE");
    };
    // A readable file holds the pid; anything else must be the pid itself.
    let pid_text = std::fs::read_to_string(target).unwrap_or_else(|_| target.to_owned());
    let pid = pid_text
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|pid| *pid > 0)
        .with_context(|| format!("invalid pid {:?} (from {target:?})", pid_text.trim()))?;
    Ok((command, pid))
}

#[cfg(unix)]
fn kill(pid: i32, command: Command) -> anyhow::Result<()> {
    use nix::sys::signal::Signal;
    let signal = match command {
        Command::LameDuck => Signal::SIGUSR2,
        Command::Quit => Signal::SIGINT,
        Command::Term => Signal::SIGTERM,
        Command::Stop => Signal::SIGKILL,
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)?;
    Ok(())
}

#[cfg(not(unix))]
fn kill(_pid: i32, _command: Command) -> anyhow::Result<()> {
    bail!("--signal needs a Unix system")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(arg: &str) -> String {
        match parse(arg) {
            Ok(parsed) => panic!("{arg:?} should fail, got {parsed:?}"),
            Err(error) => format!("{error:#}"),
        }
    }

    #[test]
    fn commands_map_to_their_signals_with_a_pid() {
        assert_eq!(parse("ldm=42").unwrap(), (Command::LameDuck, 42));
        assert_eq!(parse("quit=1").unwrap(), (Command::Quit, 1));
        assert_eq!(parse("term=7").unwrap(), (Command::Term, 7));
        assert_eq!(parse("stop=9").unwrap(), (Command::Stop, 9));
    }

    #[test]
    fn a_pid_file_gives_the_pid() {
        let path = std::env::temp_dir().join(format!("shaddock-signal-{}.pid", std::process::id()));
        std::fs::write(&path, "1234\n").unwrap();
        let parsed = parse(&format!("ldm={}", path.display()));
        let _ = std::fs::remove_file(&path);
        assert_eq!(parsed.unwrap(), (Command::LameDuck, 1234));
    }

    #[test]
    fn bad_input_is_named() {
        assert!(error("ldm=abc").contains("invalid pid \"abc\""));
        assert!(error("ldm=0").contains("invalid pid"));
        assert!(error("ldm=-5").contains("invalid pid"));
        assert!(error("ldm").contains("ldm=PID"));
        assert!(error("ldm=").contains("ldm=PID"));
        assert!(error("ldm=1=2").contains("more than one"));
        assert!(error("reload=1").contains("unknown signal \"reload\""));
        assert!(error("").contains("unknown signal"));
    }
}
