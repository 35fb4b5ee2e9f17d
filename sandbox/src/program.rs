//! The sandbox program as a command: the executable and the arguments
//! that come before its mode. The agent starts its jail with it; the data
//! planes start the agent with it.

use std::ffi::OsString;
use std::path::PathBuf;

/// How to start this program in a given mode: an executable and the
/// arguments that come before the mode (`armada sandbox agent`).
#[derive(Debug, Clone)]
pub struct Program {
    pub exe: PathBuf,
    pub prefix: Vec<OsString>,
}

impl Program {
    pub fn new(exe: impl Into<PathBuf>, prefix: &[&str]) -> Self {
        Program {
            exe: exe.into(),
            prefix: prefix.iter().map(OsString::from).collect(),
        }
    }

    /// The running executable, started with `prefix` before the mode.
    pub fn current(prefix: &[&str]) -> std::io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?, prefix))
    }

    /// A command that starts the program in `mode` (`agent` or `exec`).
    pub fn command(&self, mode: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(&self.prefix).arg(mode);
        cmd
    }
}
