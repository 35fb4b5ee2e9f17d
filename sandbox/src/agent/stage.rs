//! A program's files and installs, staged before its call: the version the
//! call names is read from the identity's own objects (checked against its
//! digest: what ingress judged is what is unpacked), then unpacked and its
//! install steps run in `.skills/<skill>/` of the workspace by one command
//! under the jail, as the sandbox's uid and within its profile, as any
//! call is. A mark in the directory names what was staged: the next call
//! of the same version finds it and stages nothing.

use std::time::Duration;

use serde_json::{json, Value};

use armada_core::adapters::s3::Payloads;
use armada_core::ports::Blobs;
use armada_domain::program::ProgramCall;
use armada_domain::sandbox::hand::error_json;
use armada_domain::skill_files::{digest, skill_dir, stage_mark, MAX_UNPACKED_BYTES};

use crate::agent::Agent;
use crate::call::Call;
use crate::jail::Action;

/// The file in a staged directory naming what was staged there.
const MARK: &str = ".armada-staged";

/// The code of a staging that failed (files unreadable, a step failed).
const INSTALL_FAILED: &str = "INSTALL_FAILED";

/// The shell script that stages: the directory made afresh, the tar on
/// stdin unpacked into it, each step run there in order (the first that
/// fails ends it), and the mark written last.
fn script(dir: &str, unpack: bool, install: &[String], mark: &str) -> String {
    let mut s = format!("set -e\nrm -rf -- '{dir}'\nmkdir -p -- '{dir}'\ncd -- '{dir}'\n");
    if unpack {
        s.push_str("tar -xf - --no-same-owner --delay-directory-restore\n");
    }
    for step in install {
        // Each step in a subshell of its own: a `cd` in one is its own.
        s.push_str(&format!("( {step}\n)\n"));
    }
    s.push_str(&format!("printf '%s' '{mark}' > {MARK}\n"));
    s
}

impl Agent {
    /// Stages `p`'s files and installs unless this version is there;
    /// `Err`: the call's error (it does not run).
    pub(super) async fn stage(&self, p: &ProgramCall, timeout: Duration) -> Result<(), Value> {
        if p.files.is_none() && p.install.is_empty() {
            return Ok(());
        }
        let dir = skill_dir(&p.skill);
        let mark = stage_mark(p.files.as_ref().map(|f| f.sha256.as_str()), &p.install);
        let at = self.runner.env.workspace().join(&dir).join(MARK);
        // Read as the agent, compared and never shown: a mark the calls
        // wrote themselves only skips what they could redo anyway.
        if std::fs::read(&at).is_ok_and(|m| m == mark.as_bytes()) {
            return Ok(());
        }
        let tar = match &p.files {
            Some(f) => Some(self.skill_files(&f.key, &f.sha256).await.map_err(|why| {
                error_json(
                    INSTALL_FAILED,
                    format!("the files of skill '{}' could not be read: {why}", p.skill),
                )
            })?),
            None => None,
        };
        let call = Call {
            action: Action::Exec {
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    script(&dir, tar.is_some(), &p.install, &mark),
                ],
            },
            run_id: "stage".into(),
            stdin: tar,
            timeout,
            bind_ports: vec![],
            env: vec![],
            effects: None,
        };
        tracing::info!(skill = %p.skill, "staging a program's files and installs");
        let run =
            self.runner.run(call).await.map_err(|e| {
                error_json(INSTALL_FAILED, format!("the staging could not run: {e}"))
            })?;
        if run.exit_code == Some(0) && run.refused().is_none() && !run.timed_out {
            return Ok(());
        }
        let why = match (run.refused(), run.timed_out) {
            (Some(r), _) => format!("the sandbox refused to run it: {r}"),
            (None, true) => format!("it timed out after {} s", timeout.as_secs()),
            (None, false) => format!(
                "it exited {}",
                run.exit_code.or(run.signal.map(|s| 128 + s)).unwrap_or(-1)
            ),
        };
        let mut err = error_json(
            INSTALL_FAILED,
            format!("staging skill '{}' failed: {why}", p.skill),
        );
        if let Some(e) = err.as_object_mut() {
            e.insert("stdout".into(), json!(run.stdout.text));
            e.insert("stderr".into(), json!(run.stderr.text));
        }
        Err(err)
    }

    /// The version `sha256` of a program's files, from the identity's
    /// own objects, checked against its digest.
    async fn skill_files(&self, key: &str, sha256: &str) -> Result<Vec<u8>, String> {
        let objects = Payloads::new(self.aws.s3.clone(), &self.cfg.payload_bucket);
        let buf = objects
            .get_bytes_bounded(key, MAX_UNPACKED_BYTES)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|_| "the object is larger than any upload".to_string())?;
        if digest(&buf) != sha256 {
            return Err("the object is not the version the call names".into());
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_unpacks_then_installs_in_order_and_marks_last() {
        let s = script(
            ".skills/tool",
            true,
            &["npm ci".into(), "cd sub && make".into()],
            "abc",
        );
        let at = |needle: &str| s.find(needle).unwrap();
        assert!(s.starts_with("set -e\n"));
        assert!(at("rm -rf -- '.skills/tool'") < at("tar -xf -"));
        assert!(at("tar -xf -") < at("( npm ci\n)"));
        assert!(at("( npm ci\n)") < at("( cd sub && make\n)"));
        assert!(at("( cd sub && make\n)") < at("printf '%s' 'abc' > .armada-staged"));
        assert!(!script(".skills/t", false, &[], "m").contains("tar"));
    }
}
