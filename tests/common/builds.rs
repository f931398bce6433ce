//! The worker libraries in other languages, built once per test binary: the TypeScript
//! workers (`workers/ts`, `npm run build`) and the Go echo worker (`workers/go`).

#![allow(dead_code)] // each test file runs the workers it needs

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The TypeScript workers' build.
pub struct Ts {
    pub node: PathBuf,
    /// `workers/ts/dist`: `echo.js`, `tally.js`, `shop.js`...
    pub dist: PathBuf,
}

impl Ts {
    /// The built script of worker `name` (`dist/<name>.js`).
    pub fn script(&self, name: &str) -> PathBuf {
        self.dist.join(format!("{name}.js"))
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Builds `workers/ts` once (its dependencies installed by the test command).
pub fn ts() -> &'static Ts {
    static BUILT: OnceLock<Ts> = OnceLock::new();
    BUILT.get_or_init(|| {
        let ts = root().join("workers/ts");
        assert!(
            ts.join("node_modules").is_dir(),
            "workers/ts has no node_modules: run `npm ci --prefix workers/ts` first"
        );
        run(&ts, "npm", &["run", "--silent", "build"]);
        Ts {
            node: PathBuf::from(std::env::var_os("NODE").unwrap_or("node".into())),
            dist: ts.join("dist"),
        }
    })
}

/// Builds the Go echo worker once; its binary.
pub fn go_echo() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("echo-go");
        let out = binary.to_str().unwrap().to_owned();
        run(
            &root().join("workers/go"),
            "go",
            &["build", "-o", &out, "."],
        );
        binary
    })
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap_or_else(|e| panic!("cannot run `{program}` (is it installed?): {e}"));
    assert!(
        status.success(),
        "`{program} {}` in {} failed: {status}",
        args.join(" "),
        dir.display()
    );
}
