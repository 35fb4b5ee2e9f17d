//! Which tool calls need a human's approval (ARCHITECTURE §6, seed 000 §B
//! and §F). An agent's `approvals` block names its approvers and how its
//! medium-risk calls go; [`gate`] judges every planned call, by pure rules:
//!
//! - a `high`-risk skill needs approval;
//! - a `medium`-risk skill needs it when the policy says `medium: approve`;
//! - a skill named in `require` needs it;
//! - destructive sandbox work is `high` even inside the workspace: any
//!   sandbox call of an agent that mounts a read-write sub-path of the
//!   user's workspace, and `shell_exec` commands that delete recursively
//!   (`rm -r`, `find -delete`), `git reset --hard` or `git clean -f`.
//!   (A `file_write` over an existing file is judged by the sandbox, which
//!   alone can see the file: it refuses the write until it is approved.)

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fields::{FieldError, Fields};
use crate::skills::{Risk, SkillManifest, SHELL_EXEC};

/// How long an approval waits for a decision by default (a day).
pub const DEFAULT_EXPIRES_S: u64 = 86_400;
/// The shortest and longest an approval may wait.
pub const MIN_EXPIRES_S: u64 = 10;
pub const MAX_EXPIRES_S: u64 = 7 * 86_400;
/// At most this many approvers are notified per approval.
pub const MAX_APPROVERS: usize = 20;

/// What a medium-risk call does.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediumRisk {
    #[default]
    Execute,
    Approve,
}

/// What a rejected (or expired) approval does to the Run.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnReject {
    /// The refusal is the call's result: the model carries on.
    #[default]
    TellModel,
    /// The Run fails.
    Fail,
}

/// What a call whose effect is unknown (`TOOL_INDETERMINATE`) does.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnIndeterminate {
    /// The Run fails (the foundation's rule).
    #[default]
    Fail,
    /// A human settles it through an approval.
    Ask,
}

/// How an agent's unapproved sandbox calls are judged destructive.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Destructive {
    /// By the command's words alone (`rm -r`, `git reset --hard`...): a
    /// hint, which a wrapper or a program defeats. Calls that rewrite
    /// files as they work (builds, `git commit`) run unasked.
    #[default]
    Words,
    /// By their effect: every unapproved `shell_exec` and `python_exec`
    /// runs over a copy-on-write view of the workspace, and one that
    /// deletes, truncates, renames over or rewrites a file that was there
    /// waits, its changes held, for an approval that lists them (the words
    /// still ask before it runs).
    Effect,
}

/// An agent's approval policy (`approvals` in its definition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalPolicy {
    #[serde(default)]
    pub require: Vec<String>,
    #[serde(default)]
    pub medium: MediumRisk,
    /// Who is notified; anyone of the tenant holding an `approver` key may
    /// decide too.
    #[serde(default)]
    pub approvers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_webhook_url: Option<String>,
    #[serde(default = "default_expires")]
    pub expires_s: u64,
    #[serde(default)]
    pub on_reject: OnReject,
    #[serde(default)]
    pub allow_self_approval: bool,
    #[serde(default)]
    pub indeterminate: OnIndeterminate,
    #[serde(default)]
    pub destructive: Destructive,
}

fn default_expires() -> u64 {
    DEFAULT_EXPIRES_S
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        ApprovalPolicy {
            require: vec![],
            medium: MediumRisk::Execute,
            approvers: vec![],
            chat_webhook_url: None,
            expires_s: DEFAULT_EXPIRES_S,
            on_reject: OnReject::TellModel,
            allow_self_approval: false,
            indeterminate: OnIndeterminate::Fail,
            destructive: Destructive::Words,
        }
    }
}

/// The fields of an agent's `approvals` section.
pub const APPROVAL_FIELDS: [&str; 9] = [
    "require",
    "medium",
    "approvers",
    "chat_webhook_url",
    "expires_s",
    "on_reject",
    "allow_self_approval",
    "indeterminate",
    "destructive",
];

impl ApprovalPolicy {
    /// Parses the `approvals` object of an agent definition; errors name
    /// the field (`approvals.…`).
    pub fn from_fields(f: &Fields<'_>) -> Result<Self, FieldError> {
        f.only(&APPROVAL_FIELDS)?;
        let mut p = ApprovalPolicy {
            require: f.opt_str_list("require")?.unwrap_or_default(),
            ..ApprovalPolicy::default()
        };
        if let Some(m) = f.opt_str("medium")? {
            p.medium = match m {
                "execute" => MediumRisk::Execute,
                "approve" => MediumRisk::Approve,
                _ => return Err(field("medium", "must be execute or approve")),
            };
        }
        p.approvers = f.opt_str_list("approvers")?.unwrap_or_default();
        if p.approvers.len() > MAX_APPROVERS {
            return Err(field(
                "approvers",
                &format!("at most {MAX_APPROVERS} approvers"),
            ));
        }
        for (i, a) in p.approvers.iter().enumerate() {
            if !valid_email(a) {
                return Err(field(
                    &format!("approvers[{i}]"),
                    &format!("'{a}' is not an email address"),
                ));
            }
        }
        if let Some(url) = f.opt_str("chat_webhook_url")? {
            if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() > 2048 {
                return Err(field(
                    "chat_webhook_url",
                    "must be an http(s) URL of at most 2048 bytes",
                ));
            }
            p.chat_webhook_url = Some(url.to_string());
        }
        if let Some(s) = f.opt_u64("expires_s")? {
            if !(MIN_EXPIRES_S..=MAX_EXPIRES_S).contains(&s) {
                return Err(field(
                    "expires_s",
                    &format!("must be between {MIN_EXPIRES_S} and {MAX_EXPIRES_S} seconds"),
                ));
            }
            p.expires_s = s;
        }
        if let Some(r) = f.opt_str("on_reject")? {
            p.on_reject = match r {
                "tell_model" => OnReject::TellModel,
                "fail" => OnReject::Fail,
                _ => return Err(field("on_reject", "must be tell_model or fail")),
            };
        }
        p.allow_self_approval = f.opt_bool("allow_self_approval")?.unwrap_or(false);
        if let Some(i) = f.opt_str("indeterminate")? {
            p.indeterminate = match i {
                "fail" => OnIndeterminate::Fail,
                "ask" => OnIndeterminate::Ask,
                _ => return Err(field("indeterminate", "must be fail or ask")),
            };
        }
        if let Some(d) = f.opt_str("destructive")? {
            p.destructive = match d {
                "words" => Destructive::Words,
                "effect" => Destructive::Effect,
                _ => return Err(field("destructive", "must be words or effect")),
            };
        }
        Ok(p)
    }
}

fn field(name: &str, message: &str) -> FieldError {
    FieldError::new(&format!("approvals.{name}"), message)
}

/// A plain check: one `@`, something on each side, a dot in the domain,
/// no spaces or header-breaking characters.
pub fn valid_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    s.len() <= 254
        && !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains('@')
        && s.chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '<' | '>' | ',' | ';' | '"'))
}

/// What a planned call needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Execute,
    /// A human must approve it first: at `risk`, for these reasons.
    Approve {
        risk: Risk,
        reasons: Vec<String>,
    },
}

/// What the gate knows about a call besides its skill and arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallFacts {
    /// The call runs in the agent's sandbox.
    pub in_sandbox: bool,
    /// The agent's sandbox mounts a read-write sub-path of the workspace.
    pub destructive_mount: bool,
}

/// Judges one planned call.
pub fn gate(
    policy: &ApprovalPolicy,
    manifest: &SkillManifest,
    args: &Value,
    facts: CallFacts,
) -> Gate {
    let mut risk = manifest.risk;
    let mut reasons = Vec::new();
    match manifest.risk {
        Risk::High => reasons.push(format!("{} is a high-risk skill", manifest.name)),
        Risk::Medium if policy.medium == MediumRisk::Approve => reasons.push(format!(
            "{} is a medium-risk skill and the agent's policy approves those",
            manifest.name
        )),
        Risk::Low | Risk::Medium => {}
    }
    if policy.require.iter().any(|s| s == &manifest.name) {
        reasons.push(format!(
            "the agent's policy requires approval for {}",
            manifest.name
        ));
    }
    if facts.in_sandbox && facts.destructive_mount {
        risk = Risk::High;
        reasons.push(
            "the agent's sandbox mounts a read-write sub-path of the user's workspace".into(),
        );
    }
    if manifest.name == SHELL_EXEC {
        if let Some(why) = args
            .get("command")
            .and_then(Value::as_str)
            .and_then(destructive_command)
        {
            risk = Risk::High;
            reasons.push(why.to_string());
        }
    }
    if reasons.is_empty() {
        Gate::Execute
    } else {
        Gate::Approve { risk, reasons }
    }
}

/// Why a shell command is destructive, if it is: a recursive delete, a
/// hard reset or a forced clean, anywhere in a pipeline or list.
pub fn destructive_command(command: &str) -> Option<&'static str> {
    command
        .split(['\n', ';', '|', '&', '(', ')', '`'])
        .find_map(|part| destructive_simple(&words(part)))
}

/// The words of a simple command, with quotes dropped and the command
/// word found behind `sudo`, `env`, `command`, `exec`, `xargs` and
/// variable assignments.
fn words(part: &str) -> Vec<String> {
    let mut w: Vec<String> = part
        .split_whitespace()
        .map(|s| s.trim_matches(|c| c == '\'' || c == '"').to_string())
        .collect();
    while let Some(first) = w.first() {
        let wrapper = matches!(
            first.as_str(),
            "sudo" | "env" | "command" | "exec" | "xargs" | "nohup" | "time" | "nice"
        );
        let assignment = first.contains('=') && !first.starts_with('-');
        let option_of_wrapper = first.starts_with('-');
        if wrapper || assignment || option_of_wrapper {
            w.remove(0);
        } else {
            break;
        }
    }
    w
}

fn destructive_simple(w: &[String]) -> Option<&'static str> {
    let cmd = w.first()?.rsplit('/').next().unwrap_or_default();
    let args = &w[1..];
    let short_flag = |c: char| {
        args.iter()
            .any(|a| a.starts_with('-') && !a.starts_with("--") && a.contains(c))
    };
    let long_flag = |f: &str| args.iter().any(|a| a == f);
    match cmd {
        "rm" if short_flag('r') || short_flag('R') || long_flag("--recursive") => {
            Some("the command deletes recursively (rm -r)")
        }
        "find" if long_flag("-delete") => {
            Some("the command deletes what find finds (find -delete)")
        }
        "git" => {
            // The subcommand wherever it sits (`git -C dir clean -f`).
            let sub = args.iter().find(|a| *a == "reset" || *a == "clean")?;
            match sub.as_str() {
                "reset" if long_flag("--hard") => {
                    Some("the command discards changes (git reset --hard)")
                }
                "clean" if short_flag('f') || long_flag("--force") => {
                    Some("the command deletes untracked files (git clean -f)")
                }
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
