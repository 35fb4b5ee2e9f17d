//! The scripted model: deterministic answers computed only from the
//! conversation it is sent. The local stack serves it over the OpenAI
//! chat-completions protocol so the real client code path runs in tests.
//!
//! - last message a tool result → `tool <name> returned: <result>` (one line
//!   per trailing tool result);
//! - `/tool <name> <json-args>` → one tool call; `/tools [{"name","args"},..]`
//!   → several in one turn;
//! - `/recall` → every earlier user message, oldest first, joined by ` | `;
//! - `/fail <text>` → the endpoint answers HTTP 500 with `<text>`;
//! - `/sleep <ms> <rest>` → wait `<ms>`, then treat `<rest>` as the message;
//! - anything else → `echo: <input>`.

use crate::chat::{estimate_tokens, ChatMessage, ModelReply, Role, TokenUsage, ToolCall};

#[derive(Debug, Clone, PartialEq)]
pub enum Scripted {
    Reply(ModelReply),
    /// The endpoint must answer HTTP 500 with this text.
    Fail(String),
    /// Wait this many milliseconds, then do the rest.
    Sleep(u64, Box<Scripted>),
}

pub fn respond(messages: &[ChatMessage]) -> Scripted {
    let input_tokens = messages.iter().map(|m| estimate_tokens(&m.content)).sum();
    let trailing_tools: Vec<&ChatMessage> = messages
        .iter()
        .rev()
        .take_while(|m| m.role == Role::Tool)
        .collect();
    if !trailing_tools.is_empty() {
        let lines: Vec<String> = trailing_tools
            .iter()
            .rev()
            .map(|m| {
                format!(
                    "tool {} returned: {}",
                    m.name.as_deref().unwrap_or("unknown"),
                    m.content
                )
            })
            .collect();
        return Scripted::Reply(text_reply(lines.join("\n"), input_tokens));
    }
    let users: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .collect();
    let Some((last, earlier)) = users.split_last() else {
        return Scripted::Reply(text_reply("echo: ".to_string(), input_tokens));
    };
    directive(last, earlier, messages.len(), input_tokens)
}

fn directive(text: &str, earlier: &[&str], turn: usize, input_tokens: u64) -> Scripted {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("/sleep ") {
        let rest = rest.trim_start();
        let (ms, then) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Ok(ms) = ms.parse::<u64>() {
            return Scripted::Sleep(
                ms.min(600_000),
                Box::new(directive(then, earlier, turn, input_tokens)),
            );
        }
    }
    if let Some(rest) = trimmed.strip_prefix("/fail") {
        if rest.is_empty() || rest.starts_with(' ') {
            return Scripted::Fail(rest.trim().to_string());
        }
    }
    if trimmed == "/recall" || trimmed.starts_with("/recall ") {
        return Scripted::Reply(text_reply(earlier.join(" | "), input_tokens));
    }
    if let Some(rest) = trimmed.strip_prefix("/tools ") {
        if let Ok(serde_json::Value::Array(items)) = serde_json::from_str(rest.trim()) {
            let calls: Vec<ToolCall> = items
                .iter()
                .enumerate()
                .filter_map(|(i, it)| {
                    Some(ToolCall {
                        id: format!("call_{turn}_{i}"),
                        name: it.get("name")?.as_str()?.to_string(),
                        args: it.get("args").cloned().unwrap_or(serde_json::json!({})),
                    })
                })
                .collect();
            if !calls.is_empty() {
                return Scripted::Reply(tool_reply(calls, input_tokens));
            }
        }
    }
    if let Some(rest) = trimmed.strip_prefix("/tool ") {
        let rest = rest.trim();
        let (name, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
        if let Ok(args) = serde_json::from_str::<serde_json::Value>(args.trim()) {
            let call = ToolCall {
                id: format!("call_{turn}_0"),
                name: name.to_string(),
                args,
            };
            return Scripted::Reply(tool_reply(vec![call], input_tokens));
        }
    }
    Scripted::Reply(text_reply(format!("echo: {text}"), input_tokens))
}

fn text_reply(content: String, input_tokens: u64) -> ModelReply {
    let output_tokens = estimate_tokens(&content);
    ModelReply {
        content,
        tool_calls: vec![],
        usage: TokenUsage {
            input_tokens,
            output_tokens,
        },
    }
}

fn tool_reply(tool_calls: Vec<ToolCall>, input_tokens: u64) -> ModelReply {
    ModelReply {
        content: String::new(),
        tool_calls,
        usage: TokenUsage {
            input_tokens,
            output_tokens: 8,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> ChatMessage {
        ChatMessage::text(Role::User, s)
    }

    fn reply(s: Scripted) -> ModelReply {
        match s {
            Scripted::Reply(r) => r,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn echoes_plain_input() {
        let r = reply(respond(&[
            ChatMessage::text(Role::System, "sys"),
            user("hello"),
        ]));
        assert_eq!(r.content, "echo: hello");
    }

    #[test]
    fn recall_lists_earlier_user_messages_oldest_first() {
        let msgs = [
            user("one"),
            ChatMessage::text(Role::Assistant, "echo: one"),
            user("two"),
            ChatMessage::text(Role::Assistant, "echo: two"),
            user("/recall"),
        ];
        assert_eq!(reply(respond(&msgs)).content, "one | two");
    }

    #[test]
    fn tool_directives_request_calls_and_results_are_reported() {
        let r = reply(respond(&[user("/tool current_time {}")]));
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].name, "current_time");
        let r2 = reply(respond(&[user(
            r#"/tools [{"name":"a","args":{"x":1}},{"name":"b"}]"#,
        )]));
        assert_eq!(r2.tool_calls.len(), 2);
        assert_eq!(r2.tool_calls[0].args["x"], 1);
        let mut convo = vec![user("/tool current_time {}")];
        convo.push(ChatMessage {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: r.tool_calls.clone(),
            tool_call_id: None,
            name: None,
        });
        convo.push(ChatMessage::tool_result(
            &r.tool_calls[0],
            "{\"now\":\"x\"}",
        ));
        assert_eq!(
            reply(respond(&convo)).content,
            "tool current_time returned: {\"now\":\"x\"}"
        );
    }

    #[test]
    fn fail_and_sleep() {
        assert_eq!(
            respond(&[user("/fail boom")]),
            Scripted::Fail("boom".into())
        );
        match respond(&[user("/sleep 20 hi")]) {
            Scripted::Sleep(20, then) => assert_eq!(reply(*then).content, "echo: hi"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            reply(respond(&[user("/failure")])).content,
            "echo: /failure"
        );
    }
}
