//! Resuming a finished Run (seed 001 §3–4): a `delegate` call with
//! `resume_from` starts its child from a finished peer instead of from its
//! task alone. The source's transcript and tool results are copied (no
//! plan state, no pending signals: a Run has neither, and nothing else is
//! taken); the child must be the source's agent and persona (its identity);
//! the model is pinned to the source's, whatever the agent's definition or
//! the call says now (recorded in the child's `resumed_from` event); a
//! transcript that cannot be read fails the delegation closed, and one
//! larger than 80% of the pinned model's context window is refused. Never
//! a half-resumed child.

use super::CallError;
use crate::agent::AgentDefinition;
use crate::chat::{estimate_tokens, ChatMessage};
use crate::run::{Run, RunState};

pub use crate::run::family::{persona_of, ResumePlan, ResumedFrom, RunIdentity};

pub const RESUME_NOT_FOUND: &str = "RESUME_NOT_FOUND";
pub const RESUME_NOT_FINISHED: &str = "RESUME_NOT_FINISHED";
pub const RESUME_IDENTITY_MISMATCH: &str = "RESUME_IDENTITY_MISMATCH";
pub const RESUME_UNREADABLE: &str = "RESUME_UNREADABLE";
pub const RESUME_TOO_LARGE: &str = "RESUME_TOO_LARGE";

/// A resumed transcript may fill at most this share of the model's window.
const MAX_SHARE_NUM: u64 = 8;
const MAX_SHARE_DEN: u64 = 10;

/// The key of a resumed child's transcript copy.
pub fn transcript_key(tenant: &str, child_run_id: &str) -> String {
    format!("transcripts/{tenant}/{child_run_id}")
}

/// A finished Run's conversation as a resumed child takes it over: its
/// transcript (input, tool rounds) and its answer.
pub fn source_transcript(mut transcript: Vec<ChatMessage>, output: &str) -> Vec<ChatMessage> {
    transcript.push(ChatMessage::text(crate::chat::Role::Assistant, output));
    transcript
}

fn tokens(messages: &[ChatMessage]) -> u64 {
    messages
        .iter()
        .map(|m| estimate_tokens(&m.content) + 8 * m.tool_calls.len() as u64)
        .sum()
}

fn refuse(code: &'static str, message: String) -> CallError {
    CallError { code, message }
}

/// The checks of a resume, in order: the source is this tenant's and
/// completed; the target is its agent and persona; its transcript was
/// read; it fits 80% of the (pinned) model's window. `requested_model`: a
/// `model` the call asked for.
pub fn check(
    tenant: &str,
    source_run_id: &str,
    source: Option<&Run>,
    target: &AgentDefinition,
    transcript: Result<&[ChatMessage], &str>,
    requested_model: Option<&str>,
) -> Result<ResumePlan, CallError> {
    let Some(source) = source.filter(|s| s.tenant == tenant) else {
        return Err(refuse(
            RESUME_NOT_FOUND,
            format!("run '{source_run_id}' not found"),
        ));
    };
    if source.state().outcome() != RunState::Completed {
        return Err(refuse(
            RESUME_NOT_FINISHED,
            format!(
                "run '{source_run_id}' is {}: only a completed run can be resumed",
                source.state()
            ),
        ));
    }
    if source.agent != target.name {
        return Err(refuse(
            RESUME_IDENTITY_MISMATCH,
            format!(
                "run '{source_run_id}' ran as agent '{}', not '{}'",
                source.agent, target.name
            ),
        ));
    }
    let Some(identity) = source.identity.clone() else {
        return Err(refuse(
            RESUME_UNREADABLE,
            format!("run '{source_run_id}' recorded no identity to resume"),
        ));
    };
    if identity.persona_sha256 != persona_of(target) {
        return Err(refuse(
            RESUME_IDENTITY_MISMATCH,
            format!(
                "agent '{}' has another persona than when run '{source_run_id}' ran (its system prompt changed)",
                target.name
            ),
        ));
    }
    let messages = transcript.map_err(|why| {
        refuse(
            RESUME_UNREADABLE,
            format!("the transcript of run '{source_run_id}' could not be read: {why}"),
        )
    })?;
    let used = tokens(messages);
    let limit = identity.model.context_window * MAX_SHARE_NUM / MAX_SHARE_DEN;
    if used > limit {
        return Err(refuse(
            RESUME_TOO_LARGE,
            format!(
                "the transcript of run '{source_run_id}' is about {used} tokens, over 80% of model {}'s {}-token window",
                identity.model.model_id, identity.model.context_window
            ),
        ));
    }
    let model_ignored = match requested_model {
        Some(m) if m != identity.model.model_id => Some(m.to_string()),
        _ if target.model != identity.model => Some(target.model.model_id.clone()),
        _ => None,
    };
    Ok(ResumePlan {
        source_run_id: source_run_id.to_string(),
        identity,
        messages: messages.len(),
        tokens: used,
        model_ignored,
        transcript_key: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::Role;
    use crate::run::{test_run, Payload, RunEvent};

    fn agent(name: &str, prompt: &str, window: u64) -> AgentDefinition {
        AgentDefinition::from_json(
            name,
            &json!({
                "model": {"provider": "scripted", "model_id": "m1", "context_window": window},
                "system_prompt": prompt,
            }),
        )
        .unwrap()
    }

    fn finished(agent: &AgentDefinition) -> Run {
        let mut r = test_run();
        r.agent = agent.name.clone();
        r.identity = Some(RunIdentity::of(agent));
        r.apply(RunEvent::Claimed { lease_until_ms: 1 }, 1).unwrap();
        let output = Payload::Inline { text: "x".into() };
        r.apply(RunEvent::Answered { output }, 2).unwrap();
        r
    }

    fn said(n: usize) -> Vec<ChatMessage> {
        vec![ChatMessage::text(Role::User, "y".repeat(n))]
    }

    #[test]
    fn only_the_same_agent_and_persona_resume_a_completed_run() {
        let a = agent("a", "You are A.", 1000);
        let src = finished(&a);
        let t = said(10);
        let ok = check("t", "run_1", Some(&src), &a, Ok(&t), None).unwrap();
        assert_eq!(
            (ok.messages, ok.identity.model.model_id.as_str()),
            (1, "m1")
        );
        assert_eq!(ok.model_ignored, None);
        let code = |r: Result<ResumePlan, CallError>| r.unwrap_err().code;
        assert_eq!(
            code(check("other", "run_1", Some(&src), &a, Ok(&t), None)),
            RESUME_NOT_FOUND
        );
        assert_eq!(
            code(check("t", "run_1", None, &a, Ok(&t), None)),
            RESUME_NOT_FOUND
        );
        let b = agent("b", "You are A.", 1000);
        assert_eq!(
            code(check("t", "run_1", Some(&src), &b, Ok(&t), None)),
            RESUME_IDENTITY_MISMATCH
        );
        let reprompted = agent("a", "You are someone else.", 1000);
        assert_eq!(
            code(check("t", "run_1", Some(&src), &reprompted, Ok(&t), None)),
            RESUME_IDENTITY_MISMATCH
        );
        let mut running = test_run();
        running.agent = a.name.clone();
        running.identity = Some(RunIdentity::of(&a));
        running
            .apply(RunEvent::Claimed { lease_until_ms: 1 }, 1)
            .unwrap();
        assert_eq!(
            code(check("t", "run_1", Some(&running), &a, Ok(&t), None)),
            RESUME_NOT_FINISHED
        );
        assert_eq!(
            code(check("t", "run_1", Some(&src), &a, Err("gone"), None)),
            RESUME_UNREADABLE
        );
    }

    #[test]
    fn the_model_is_pinned_and_a_transcript_over_80_percent_is_refused() {
        let a = agent("a", "You are A.", 1000);
        let src = finished(&a);
        // 800 tokens of 1000 fit; a few more do not.
        let fits = said((800 - 4) * 4);
        assert!(check("t", "r", Some(&src), &a, Ok(&fits), None).is_ok());
        let over = said((801 - 4) * 4);
        assert_eq!(
            check("t", "r", Some(&src), &a, Ok(&over), None)
                .unwrap_err()
                .code,
            RESUME_TOO_LARGE
        );
        let bigger = agent("a", "You are A.", 100_000);
        let plan = check("t", "r", Some(&src), &bigger, Ok(&fits), Some("gpt-x")).unwrap();
        assert_eq!(
            plan.identity.model.context_window, 1000,
            "pinned to the source's"
        );
        assert_eq!(plan.model_ignored.as_deref(), Some("gpt-x"));
        let plan = check("t", "r", Some(&src), &bigger, Ok(&fits), None).unwrap();
        assert_eq!(
            plan.model_ignored.as_deref(),
            Some("m1"),
            "the agent's own changed window"
        );
    }
}
