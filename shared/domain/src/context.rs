//! Context assembly: system prompt, the session's accumulated history and the
//! current Run's own messages, compacted when they would overflow the model's
//! context window.

use serde::{Deserialize, Serialize};

use serde_json::json;

use crate::chat::{estimate_tokens, ChatMessage, Role, ToolCall};
use crate::collab::children::round_message_at;
use crate::run::{LogEvent, RunEventRecord};

/// One turn of an AgentSession's history.
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryTurn {
    pub role: Role,
    pub content: String,
    pub run_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    pub dropped_turns: usize,
    pub kept_turns: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Assembled {
    pub messages: Vec<ChatMessage>,
    pub compaction: Option<Compaction>,
}

/// The share of the context window the prompt may fill; the rest is left for
/// the answer.
const PROMPT_SHARE_NUM: u64 = 3;
const PROMPT_SHARE_DEN: u64 = 4;

pub fn assemble(
    system_prompt: &str,
    history: &[HistoryTurn],
    run_messages: &[ChatMessage],
    context_window: u64,
) -> Assembled {
    let budget = context_window * PROMPT_SHARE_NUM / PROMPT_SHARE_DEN;
    let fixed: u64 = estimate_tokens(system_prompt)
        + run_messages
            .iter()
            .map(|m| estimate_tokens(&m.content) + 8 * m.tool_calls.len() as u64)
            .sum::<u64>();
    let costs: Vec<u64> = history
        .iter()
        .map(|t| estimate_tokens(&t.content))
        .collect();
    // Keep the newest turns that fit; drop from the oldest.
    let mut used = fixed;
    let mut keep_from = history.len();
    for (i, cost) in costs.iter().enumerate().rev() {
        if used + cost > budget {
            break;
        }
        used += cost;
        keep_from = i;
    }
    // Never start the kept history on an assistant turn without its question.
    while keep_from < history.len() && history[keep_from].role == Role::Assistant {
        keep_from += 1;
    }
    let mut messages = vec![ChatMessage::text(Role::System, system_prompt)];
    let compaction = (keep_from > 0).then(|| {
        messages.push(ChatMessage::text(
            Role::System,
            format!(
                "[{keep_from} earlier turns of this conversation were compacted to fit the context window]"
            ),
        ));
        Compaction {
            dropped_turns: keep_from,
            kept_turns: history.len() - keep_from,
        }
    });
    messages.extend(
        history[keep_from..]
            .iter()
            .map(|t| ChatMessage::text(t.role, t.content.clone())),
    );
    messages.extend(run_messages.iter().cloned());
    Assembled {
        messages,
        compaction,
    }
}

/// The Run's own conversation so far: its input, then every tool round
/// (and, for a fan-out team's Run, the round-2 message over its members).
pub fn transcript(input: &str, log: &[RunEventRecord]) -> Vec<ChatMessage> {
    let mut msgs = vec![ChatMessage::text(Role::User, input)];
    for ev in log {
        match &ev.event {
            LogEvent::RoundStarted { .. } => {
                if let Some(text) = round_message_at(log, ev) {
                    msgs.push(ChatMessage::text(Role::User, &text));
                }
            }
            LogEvent::ModelReply {
                content,
                tool_calls,
                ..
            } if !tool_calls.is_empty() => {
                msgs.push(ChatMessage {
                    role: Role::Assistant,
                    content: content.clone(),
                    tool_calls: tool_calls.clone(),
                    tool_call_id: None,
                    name: None,
                });
            }
            LogEvent::ToolResult {
                call_id,
                name,
                result,
                ..
            } => {
                let call = ToolCall {
                    id: call_id.clone(),
                    name: name.clone(),
                    args: json!({}),
                };
                msgs.push(ChatMessage::tool_result(&call, result.to_string()));
            }
            _ => {}
        }
    }
    msgs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(n: usize, size: usize) -> Vec<HistoryTurn> {
        (0..n)
            .map(|i| HistoryTurn {
                role: if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                },
                content: format!("{i}:{}", "x".repeat(size)),
                run_id: format!("r{}", i / 2),
            })
            .collect()
    }

    #[test]
    fn small_history_is_kept_whole() {
        let a = assemble(
            "sys",
            &turns(4, 10),
            &[ChatMessage::text(Role::User, "q")],
            4096,
        );
        assert!(a.compaction.is_none());
        assert_eq!(a.messages.len(), 6);
    }

    #[test]
    fn overflowing_history_drops_oldest_turns_and_says_so() {
        let a = assemble(
            "sys",
            &turns(40, 400),
            &[ChatMessage::text(Role::User, "q")],
            1024,
        );
        let c = a.compaction.expect("compacted");
        assert!(c.dropped_turns > 0 && c.kept_turns > 0);
        assert_eq!(c.dropped_turns + c.kept_turns, 40);
        // The newest turn survives, the oldest does not, and the kept part
        // starts with a user turn.
        let texts: Vec<&str> = a.messages.iter().map(|m| m.content.as_str()).collect();
        assert!(texts.iter().any(|t| t.starts_with("39:")));
        assert!(!texts.iter().any(|t| t.starts_with("0:")));
        assert_eq!(a.messages[2].role, Role::User);
        assert_eq!(a.messages.last().unwrap().content, "q");
    }
}
