//! The sandbox skills: argument checks, the call each one runs in the jail,
//! and the shape of its answer.
//!
//! - `shell_exec {command, timeout_s?}` and `python_exec {code, timeout_s?}`
//!   → `{exit_code, stdout, stderr}`;
//! - `file_read {path}` → `{path, content, bytes}`; `file_write {path,
//!   content}` → `{path, bytes}` (relative paths resolve in the workspace,
//!   and the confined jail does the IO, so the profile decides);
//! - `serve {command, port?}` → `{url}`: the command gets `$PORT` and keeps
//!   running after the call.
//!
//! Errors are `{"error": {"code", "message"}}`: OOM, TIMEOUT and DENIED
//! come with whatever output the call produced.

use std::time::Duration;

use serde_json::{json, Value};

use armada_domain::program::{json_answer, EnvVar};
use armada_domain::sandbox::hand::{codes, error_json};
use armada_domain::sandbox::MAX_CALL_TIMEOUT_S;
use armada_domain::secret::{Scrubber, SecretValue};
use armada_domain::skills::{FILE_READ, FILE_WRITE, PROGRAM, PYTHON_EXEC, SERVE, SHELL_EXEC};

use armada_domain::sandbox::controls::Enforcement;

use crate::call::Call;
use crate::effects;
use crate::jail::{file_exit, Action, Step, REFUSED};
use crate::runner::{CallRun, Runner};

/// Largest file `file_read` returns whole.
pub const FILE_READ_MAX: u64 = 256 * 1024;
/// Largest command or program accepted.
const MAX_SOURCE: usize = 128 * 1024;

/// What the sandbox must do after a call (seed 000 §C–D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aftermath {
    Keep,
    /// OOM or timeout: the sandbox is destroyed; the next call gets a fresh one.
    Destroy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SkillAnswer {
    pub result: Value,
    pub aftermath: Aftermath,
}

impl SkillAnswer {
    fn keep(result: Value) -> Self {
        SkillAnswer {
            result,
            aftermath: Aftermath::Keep,
        }
    }

    /// A call answered with its error, not run.
    pub fn refused(error: Value) -> Self {
        SkillAnswer::keep(error)
    }
}

/// The program a call of a skill that brings one runs, its environment
/// opened.
#[derive(Debug, Clone)]
pub struct Opened {
    pub command: Vec<String>,
    pub env: Vec<EnvVar>,
}

/// A port granted to a `serve` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGrant {
    /// The pool's container port (8081–8090).
    pub container: u16,
    /// The port the process binds in this environment.
    pub bind: u16,
    /// Where it is reachable from outside.
    pub url: String,
}

fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, Value> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| {
        error_json(
            codes::INVALID_ARGS,
            format!("'{name}' is required and must be a string"),
        )
    })
}

/// The call's timeout: the argument, capped by what the dispatcher allowed.
fn timeout_of(args: &Value, allowed_s: u32) -> Result<Duration, Value> {
    let asked = match args.get("timeout_s") {
        None | Some(Value::Null) => allowed_s,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u64::from(MAX_CALL_TIMEOUT_S) => n as u32,
            _ => {
                return Err(error_json(
                    codes::INVALID_ARGS,
                    format!("'timeout_s' must be an integer from 1 to {MAX_CALL_TIMEOUT_S}"),
                ))
            }
        },
    };
    Ok(Duration::from_secs(u64::from(asked.min(allowed_s))))
}

fn source(args: &Value, name: &str) -> Result<String, Value> {
    let s = str_arg(args, name)?;
    if s.len() > MAX_SOURCE {
        return Err(error_json(
            codes::TOO_LARGE,
            format!("'{name}' is over {MAX_SOURCE} bytes"),
        ));
    }
    Ok(s.to_string())
}

/// The common shape of a command's answer, or its error.
fn command_answer(run: &CallRun, timeout: Duration, memory_mb: u64) -> SkillAnswer {
    let outputs = json!({
        "stdout": run.stdout.text,
        "stderr": run.stderr.text,
    });
    let with = |mut err: Value| {
        if let (Some(e), Some(o)) = (err.as_object_mut(), outputs.as_object()) {
            e.extend(o.clone());
        }
        err
    };
    if let Some(why) = run.refused() {
        return SkillAnswer::keep(with(error_json(
            codes::DENIED,
            format!("the sandbox refused to run the call without its controls: {why}"),
        )));
    }
    if run.timed_out {
        return SkillAnswer {
            result: with(error_json(
                codes::TIMEOUT,
                format!("killed (SIGKILL) after the {} s timeout", timeout.as_secs()),
            )),
            aftermath: Aftermath::Destroy,
        };
    }
    if run.oom {
        return SkillAnswer {
            result: with(error_json(
                codes::OOM,
                format!("killed: out of memory (the sandbox has {memory_mb} MB)"),
            )),
            aftermath: Aftermath::Destroy,
        };
    }
    let exit_code = run.exit_code.or(run.signal.map(|s| 128 + s)).unwrap_or(-1);
    let mut v = json!({
        "exit_code": exit_code,
        "stdout": run.stdout.text,
        "stderr": run.stderr.text,
    });
    if run.stdout.truncated {
        v["stdout_truncated_bytes"] = json!(run.stdout.bytes - run.stdout.text.len() as u64);
    }
    if run.stderr.truncated {
        v["stderr_truncated_bytes"] = json!(run.stderr.bytes - run.stderr.text.len() as u64);
    }
    if run.reaped > 0 {
        v["reaped_processes"] = json!(run.reaped);
    }
    SkillAnswer::keep(v)
}

/// A `json` program's answer: its output's JSON, or its failure; the
/// values of the secrets it was given scrubbed from either.
fn program_answer(ran: SkillAnswer, p: &Opened) -> SkillAnswer {
    let secrets = p.env.iter().filter_map(|v| {
        let name = v.secret.clone()?;
        Some((name, SecretValue::new(v.value.clone())))
    });
    let scrubber = Scrubber::new(secrets);
    let text = |k: &str| ran.result[k].as_str().unwrap_or_default().to_string();
    let mut result = if ran.result.get("error").is_some() {
        ran.result.clone()
    } else {
        let exit_code = ran.result["exit_code"].as_i64().unwrap_or(-1);
        match json_answer(exit_code, &text("stdout"), &text("stderr")) {
            Ok(v) => v,
            Err((code, message)) => error_json(&code, message),
        }
    };
    scrubber.scrub(&mut result);
    SkillAnswer {
        result,
        aftermath: ran.aftermath,
    }
}

fn runner_failed(e: impl std::fmt::Display) -> SkillAnswer {
    SkillAnswer::keep(error_json(
        codes::SANDBOX_UNAVAILABLE,
        format!("the sandbox could not run the call: {e}"),
    ))
}

/// Runs a non-`serve` skill call; `approved`: a human approved it (a
/// `file_write` may then replace a file). Its changes are not judged.
pub async fn invoke(
    runner: &Runner,
    skill: &str,
    args: &Value,
    run_id: &str,
    allowed_timeout_s: u32,
    approved: bool,
) -> SkillAnswer {
    let judged = Judged {
        key: None,
        approved,
    };
    invoke_judged(runner, skill, args, run_id, allowed_timeout_s, judged, None).await
}

/// Whether a human approved a call, and whether its changes to the
/// workspace are judged ([`crate::effects`]).
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    /// The call's held-changes key ([`effects::held_key`]); `None`: its
    /// changes are kept as they are made.
    pub key: Option<&'a str>,
    pub approved: bool,
}

/// [`invoke`], with the call's changes judged as `judged` says.
pub async fn invoke_judged(
    runner: &Runner,
    skill: &str,
    args: &Value,
    run_id: &str,
    allowed_timeout_s: u32,
    judged: Judged<'_>,
    program: Option<&Opened>,
) -> SkillAnswer {
    let answer = invoke_inner(
        runner,
        skill,
        args,
        run_id,
        allowed_timeout_s,
        judged,
        program,
    );
    match answer.await {
        Ok(a) => a,
        Err(e) => SkillAnswer::keep(e),
    }
}

/// Why a call that ran with the workspace's files kept (no overlay) and
/// failed waits for an approval.
const KEPT_AND_FAILED: &str = "it failed while removing, renaming and truncating the \
    workspace's files was denied (this sandbox cannot hold a call's changes apart); \
    approved, it runs again with them allowed";

/// A command call, its changes to the workspace judged when `judged` has
/// a key and no approval: over an overlay, applied if they only add and
/// held for an approval if they delete or change what was there; an
/// approved call whose changes were held has them applied, and answers as
/// it did when it ran.
async fn command(
    runner: &Runner,
    c: Call,
    judged: Judged<'_>,
    timeout: Duration,
    memory_mb: u64,
) -> Result<SkillAnswer, Value> {
    let plain = |c: Call| async move {
        let run = runner.run(c).await.map_err(|e| runner_failed(e).result)?;
        Ok::<_, Value>(command_answer(&run, timeout, memory_mb))
    };
    let Some(key) = judged.key.filter(|_| runner.env.caps.enforce) else {
        return plain(c).await;
    };
    let root = runner.env.root.clone();
    let workspace = runner.env.workspace();
    if judged.approved {
        let Some(held) = effects::Held::find(&root, key) else {
            return plain(c).await;
        };
        apply_changes(runner, &c, held.upper(), &held.record.changes).await?;
        let answer = held.record.answer.clone();
        held.discard();
        return Ok(SkillAnswer::keep(answer));
    }
    effects::prune(&root);
    let layers = effects::Layers::make(&root, &workspace, "call")
        .map_err(|e| runner_failed(format!("the call's overlay layers: {e}")).result)?;
    let overlay = crate::jail::OverlayLayers {
        upper: layers.upper.clone(),
        work: layers.work.clone(),
    };
    let run = runner.run(Call {
        effects: Some(overlay),
        ..c.clone()
    });
    let run = match run.await {
        Ok(r) => r,
        Err(e) => {
            layers.discard();
            return Err(runner_failed(e).result);
        }
    };
    let answer = command_answer(&run, timeout, memory_mb);
    match run.report.status(Step::Effects) {
        Enforcement::Enforced => {
            let changes = match effects::judge(&layers.upper, &workspace) {
                Ok(ch) => ch,
                Err(e) => {
                    layers.discard();
                    return Err(runner_failed(format!("reading the call's changes: {e}")).result);
                }
            };
            if changes.is_empty() {
                layers.discard();
                return Ok(answer);
            }
            if !changes.destructive() {
                let applied = apply_changes(runner, &c, layers.upper.clone(), &changes).await;
                layers.discard();
                applied?;
                return Ok(answer);
            }
            let message = format!(
                "the call would change what the workspace holds: it {}. Its changes are held \
                 until a human approves them",
                changes.describe()
            );
            layers
                .hold(key, &changes, &answer.result)
                .map_err(|e| runner_failed(format!("holding the call's changes: {e}")).result)?;
            Err(error_json(codes::APPROVAL_REQUIRED, message))
        }
        Enforcement::Partial => {
            layers.discard();
            let failed = answer.result.get("error").is_some()
                || answer.result.get("exit_code").and_then(Value::as_i64) != Some(0);
            if failed && answer.aftermath == Aftermath::Keep {
                return Err(error_json(codes::APPROVAL_REQUIRED, KEPT_AND_FAILED));
            }
            Ok(answer)
        }
        Enforcement::NotEnforced => {
            // Neither an overlay nor Landlock held: the call ran as any
            // other, its words the only hint (judged before it was sent).
            layers.discard();
            Ok(answer)
        }
    }
}

/// Applies changes read from `source` to the workspace, in a jail.
async fn apply_changes(
    runner: &Runner,
    c: &Call,
    source: std::path::PathBuf,
    changes: &effects::ChangeSet,
) -> Result<(), Value> {
    let run = runner
        .run(Call {
            action: Action::ApplyChanges {
                source,
                changes: changes.clone(),
            },
            stdin: None,
            effects: None,
            ..c.clone()
        })
        .await
        .map_err(|e| runner_failed(e).result)?;
    if run.exit_code == Some(0) && run.refused().is_none() {
        return Ok(());
    }
    Err(error_json(
        codes::IO,
        format!(
            "the call's changes could not be applied to the workspace: {}",
            run.refused().unwrap_or(run.stderr.text.trim())
        ),
    ))
}

async fn invoke_inner(
    runner: &Runner,
    skill: &str,
    args: &Value,
    run_id: &str,
    allowed_timeout_s: u32,
    judged: Judged<'_>,
    program: Option<&Opened>,
) -> Result<SkillAnswer, Value> {
    let approved = judged.approved;
    if !args.is_object() {
        return Err(error_json(
            codes::INVALID_ARGS,
            "arguments must be an object",
        ));
    }
    let timeout = timeout_of(args, allowed_timeout_s)?;
    let memory_mb = runner.env.call_memory_bytes() / (1024 * 1024);
    let call = |action, stdin| Call {
        action,
        run_id: run_id.to_string(),
        stdin,
        timeout,
        bind_ports: vec![],
        env: vec![],
        effects: None,
    };
    match skill {
        SHELL_EXEC => {
            let cmd = source(args, "command")?;
            let argv = vec!["/bin/sh".to_string(), "-c".to_string(), cmd];
            command(
                runner,
                call(Action::Exec { argv }, None),
                judged,
                timeout,
                memory_mb,
            )
            .await
        }
        PYTHON_EXEC => {
            let code = source(args, "code")?;
            let argv = vec!["python3".to_string(), "-".to_string()];
            let c = call(Action::Exec { argv }, Some(code.into_bytes()));
            command(runner, c, judged, timeout, memory_mb).await
        }
        FILE_READ => {
            let path = str_arg(args, "path")?.to_string();
            let action = Action::ReadFile {
                path: path.clone().into(),
                max_bytes: FILE_READ_MAX,
            };
            let run = runner
                .run(call(action, None))
                .await
                .map_err(|e| runner_failed(e).result)?;
            file_answer(
                &run,
                &path,
                || json!({"path": path, "content": run.stdout.text, "bytes": run.stdout.bytes}),
            )
        }
        FILE_WRITE => {
            let path = str_arg(args, "path")?.to_string();
            let content = str_arg(args, "content")?.as_bytes().to_vec();
            let n = content.len();
            let action = Action::WriteFile {
                path: path.clone().into(),
                overwrite: approved,
            };
            let run = runner
                .run(call(action, Some(content)))
                .await
                .map_err(|e| runner_failed(e).result)?;
            file_answer(&run, &path, || json!({"path": path, "bytes": n}))
        }
        PROGRAM => {
            let Some(p) = program else {
                return Err(error_json(codes::INVALID_ARGS, "the call names no program"));
            };
            let c = Call {
                action: Action::Exec {
                    argv: p.command.clone(),
                },
                run_id: run_id.to_string(),
                stdin: Some(serde_json::to_vec(args).unwrap_or_default()),
                timeout,
                bind_ports: vec![],
                env: p
                    .env
                    .iter()
                    .map(|v| (v.name.clone(), v.value.clone()))
                    .collect(),
                effects: None,
            };
            let ran = command(runner, c, judged, timeout, memory_mb).await?;
            Ok(program_answer(ran, p))
        }
        other => Err(error_json(
            codes::INVALID_ARGS,
            format!("'{other}' is not a sandbox skill"),
        )),
    }
}

fn file_answer(
    run: &CallRun,
    path: &str,
    ok: impl FnOnce() -> Value,
) -> Result<SkillAnswer, Value> {
    if let Some(why) = run.refused() {
        return Err(error_json(
            codes::DENIED,
            format!("the sandbox refused to run the call without its controls: {why}"),
        ));
    }
    let detail = run.stderr.text.trim();
    match run.exit_code {
        Some(0) => Ok(SkillAnswer::keep(ok())),
        Some(file_exit::NOT_FOUND) => Err(error_json(
            codes::NOT_FOUND,
            format!("{path}: no such file"),
        )),
        Some(file_exit::DENIED) => Err(error_json(
            codes::DENIED,
            format!("{path}: permission denied by the sandbox profile ({detail})"),
        )),
        Some(file_exit::EXISTS) => Err(error_json(
            codes::APPROVAL_REQUIRED,
            format!("file_write would overwrite {path}, which exists with other content"),
        )),
        Some(file_exit::TOO_LARGE) => {
            Err(error_json(codes::TOO_LARGE, format!("{path}: {detail}")))
        }
        Some(REFUSED) => Err(error_json(codes::DENIED, detail.to_string())),
        _ if run.timed_out => Err(error_json(codes::TIMEOUT, format!("{path}: timed out"))),
        _ => Err(error_json(codes::IO, format!("{path}: {detail}"))),
    }
}

/// Starts a `serve` call on a granted port and waits until it listens.
pub async fn serve(
    runner: &Runner,
    args: &Value,
    run_id: &str,
    grant: &PortGrant,
    allowed_timeout_s: u32,
) -> Result<(SkillAnswer, crate::runner::Detached), SkillAnswer> {
    let fail = SkillAnswer::keep;
    let command = source(args, "command").map_err(fail)?;
    if runner.env.caps.enforce && runner.env.caps.restrict_network {
        return Err(fail(error_json(
            codes::DENIED,
            "serve needs a network: this sandbox's profile restricts it",
        )));
    }
    let name = format!("svc-{}", grant.container);
    let call = Call {
        action: Action::Exec {
            argv: vec!["/bin/sh".into(), "-c".into(), command],
        },
        run_id: run_id.to_string(),
        stdin: None,
        timeout: Duration::from_secs(u64::from(allowed_timeout_s)),
        bind_ports: vec![grant.bind],
        env: vec![
            ("PORT".to_string(), grant.bind.to_string()),
            ("ARMADA_PUBLIC_URL".to_string(), grant.url.clone()),
        ],
        effects: None,
    };
    let detached = runner
        .spawn_detached(call, &name)
        .await
        .map_err(runner_failed)?;
    if let Some(why) = runner.detached_report(&name).refused {
        return Err(fail(error_json(
            codes::DENIED,
            format!("the sandbox refused to start the server without its controls: {why}"),
        )));
    }
    let wait = Duration::from_secs(u64::from(allowed_timeout_s.min(30)));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", grant.bind))
            .await
            .is_ok()
        {
            let answer = json!({"url": grant.url, "port": grant.container, "pid": detached.pid});
            return Ok((SkillAnswer::keep(answer), detached));
        }
        let alive = crate::sys::kill(detached.pid as i32, 0)
            || detached
                .cgroup
                .as_ref()
                .is_some_and(|c| !c.all_procs().is_empty());
        if !alive || tokio::time::Instant::now() >= deadline {
            let log = std::fs::read_to_string(&detached.log).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if let Some(cg) = &detached.cgroup {
                let _ = cg.destroy();
            }
            let why = if alive {
                format!(
                    "nothing listened on port {} within {} s",
                    grant.bind,
                    wait.as_secs()
                )
            } else {
                "the server exited".to_string()
            };
            return Err(fail(json!({
                "error": {"code": "SERVE_FAILED", "message": why},
                "log": tail,
            })));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub const SANDBOX_SKILLS: [&str; 5] = [SHELL_EXEC, PYTHON_EXEC, FILE_READ, FILE_WRITE, SERVE];
