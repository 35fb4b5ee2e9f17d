//! The model port and its adapters: any OpenAI-compatible chat-completions
//! endpoint (the scripted model is served over this protocol too) and Amazon
//! Bedrock Converse. Errors are classified retryable or terminal here.

use std::time::Duration;

use aws_sdk_bedrockruntime::types as br;
use serde_json::{json, Value};

use armada_domain::agent::{ModelProvider, ModelSpec};
use armada_domain::chat::{ChatMessage, ModelReply, Role, TokenUsage, ToolCall, ToolSpec};
use async_trait::async_trait;

use crate::ports::model::ModelError;
use crate::ports::Model;

#[derive(Debug, Clone)]
pub struct Models {
    http: reqwest::Client,
    scripted_url: Option<String>,
    bedrock: aws_sdk_bedrockruntime::Client,
}

impl Models {
    pub fn new(sdk_config: &aws_config::SdkConfig, scripted_url: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        Models {
            http,
            scripted_url,
            bedrock: aws_sdk_bedrockruntime::Client::new(sdk_config),
        }
    }

    async fn openai(
        &self,
        base: &str,
        key: Option<&str>,
        model: &str,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<ModelReply, ModelError> {
        let url = format!("{}/chat/completions", base.trim_end_matches('/'));
        let mut body = json!({
            "model": model,
            "messages": messages.iter().map(openai_message).collect::<Vec<_>>(),
        });
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
        }
        let mut req = self.http.post(&url).json(&body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ModelError::Retryable(format!("request to {url} failed: {e}")))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| {
            ModelError::Retryable(format!("reading the model's answer failed: {e}"))
        })?;
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(ModelError::Retryable(format!(
                "HTTP {status}: {}",
                clip(&text)
            )));
        }
        if !status.is_success() {
            return Err(ModelError::Terminal(format!(
                "HTTP {status}: {}",
                clip(&text)
            )));
        }
        parse_openai_reply(&text)
    }

    async fn converse(
        &self,
        model_id: &str,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<ModelReply, ModelError> {
        let mut system = Vec::new();
        let mut convo: Vec<br::Message> = Vec::new();
        let mut pending: Option<(br::ConversationRole, Vec<br::ContentBlock>)> = None;
        let flush = |pending: &mut Option<(br::ConversationRole, Vec<br::ContentBlock>)>,
                     convo: &mut Vec<br::Message>|
         -> Result<(), ModelError> {
            if let Some((role, content)) = pending.take() {
                let m = br::Message::builder()
                    .role(role)
                    .set_content(Some(content))
                    .build()
                    .map_err(|e| ModelError::Terminal(e.to_string()))?;
                convo.push(m);
            }
            Ok(())
        };
        for m in messages {
            let (role, blocks) = match m.role {
                Role::System => {
                    system.push(br::SystemContentBlock::Text(m.content.clone()));
                    continue;
                }
                Role::User => (
                    br::ConversationRole::User,
                    vec![br::ContentBlock::Text(m.content.clone())],
                ),
                Role::Assistant => {
                    let mut blocks = Vec::new();
                    if !m.content.is_empty() {
                        blocks.push(br::ContentBlock::Text(m.content.clone()));
                    }
                    for c in &m.tool_calls {
                        let tu = br::ToolUseBlock::builder()
                            .tool_use_id(&c.id)
                            .name(&c.name)
                            .input(to_document(&c.args))
                            .build()
                            .map_err(|e| ModelError::Terminal(e.to_string()))?;
                        blocks.push(br::ContentBlock::ToolUse(tu));
                    }
                    (br::ConversationRole::Assistant, blocks)
                }
                Role::Tool => {
                    let tr = br::ToolResultBlock::builder()
                        .tool_use_id(m.tool_call_id.clone().unwrap_or_default())
                        .content(br::ToolResultContentBlock::Text(m.content.clone()))
                        .build()
                        .map_err(|e| ModelError::Terminal(e.to_string()))?;
                    (
                        br::ConversationRole::User,
                        vec![br::ContentBlock::ToolResult(tr)],
                    )
                }
            };
            // Converse wants alternating roles: merge consecutive same-role blocks.
            match &mut pending {
                Some((r, content)) if *r == role => content.extend(blocks),
                _ => {
                    flush(&mut pending, &mut convo)?;
                    pending = Some((role, blocks));
                }
            }
        }
        flush(&mut pending, &mut convo)?;
        let mut req = self
            .bedrock
            .converse()
            .model_id(model_id)
            .set_system(Some(system))
            .set_messages(Some(convo));
        if !tools.is_empty() {
            let mut tc = br::ToolConfiguration::builder();
            for t in tools {
                let spec = br::ToolSpecification::builder()
                    .name(&t.name)
                    .description(&t.description)
                    .input_schema(br::ToolInputSchema::Json(to_document(&t.parameters)))
                    .build()
                    .map_err(|e| ModelError::Terminal(e.to_string()))?;
                tc = tc.tools(br::Tool::ToolSpec(spec));
            }
            req = req.tool_config(
                tc.build()
                    .map_err(|e| ModelError::Terminal(e.to_string()))?,
            );
        }
        let out = req.send().await.map_err(|e| {
            let retryable = matches!(
                e.as_service_error(),
                Some(
                    aws_sdk_bedrockruntime::operation::converse::ConverseError::ThrottlingException(_)
                        | aws_sdk_bedrockruntime::operation::converse::ConverseError::ServiceUnavailableException(_)
                        | aws_sdk_bedrockruntime::operation::converse::ConverseError::InternalServerException(_)
                        | aws_sdk_bedrockruntime::operation::converse::ConverseError::ModelNotReadyException(_)
                )
            ) || e.as_service_error().is_none();
            let msg = aws_smithy_types::error::display::DisplayErrorContext(&e).to_string();
            if retryable {
                ModelError::Retryable(msg)
            } else {
                ModelError::Terminal(msg)
            }
        })?;
        let mut content = String::new();
        let mut tool_calls = Vec::new();
        if let Some(br::ConverseOutput::Message(msg)) = out.output() {
            for block in msg.content() {
                match block {
                    br::ContentBlock::Text(t) => content.push_str(t),
                    br::ContentBlock::ToolUse(tu) => tool_calls.push(ToolCall {
                        id: tu.tool_use_id().to_string(),
                        name: tu.name().to_string(),
                        args: from_document(tu.input()),
                    }),
                    _ => {}
                }
            }
        }
        let usage = out
            .usage()
            .map(|u| TokenUsage {
                input_tokens: u.input_tokens().max(0) as u64,
                output_tokens: u.output_tokens().max(0) as u64,
            })
            .unwrap_or_default();
        Ok(ModelReply {
            content,
            tool_calls,
            usage,
        })
    }
}

#[async_trait]
impl Model for Models {
    async fn complete(
        &self,
        spec: &ModelSpec,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<ModelReply, ModelError> {
        match spec.provider {
            ModelProvider::Scripted => {
                let base = self.scripted_url.as_deref().ok_or_else(|| {
                    ModelError::Terminal(
                        "no scripted model is configured in this deployment".into(),
                    )
                })?;
                self.openai(base, None, &spec.model_id, messages, tools)
                    .await
            }
            ModelProvider::Openai => {
                let base = spec
                    .base_url
                    .as_deref()
                    .ok_or_else(|| ModelError::Terminal("openai model without base_url".into()))?;
                let key = spec
                    .api_key_env
                    .as_deref()
                    .and_then(|name| std::env::var(name).ok());
                self.openai(base, key.as_deref(), &spec.model_id, messages, tools)
                    .await
            }
            ModelProvider::Bedrock => self.converse(&spec.model_id, messages, tools).await,
        }
    }
}

fn clip(s: &str) -> &str {
    let end = s.char_indices().nth(300).map(|(i, _)| i).unwrap_or(s.len());
    &s[..end]
}

fn openai_tool_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.args.to_string()}})
        })
        .collect()
}

fn openai_message(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut v = json!({"role": role, "content": m.content});
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = openai_tool_calls(&m.tool_calls);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if let Some(name) = &m.name {
        v["name"] = json!(name);
    }
    v
}

/// Parses an OpenAI chat-completions response body.
pub fn parse_openai_reply(text: &str) -> Result<ModelReply, ModelError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ModelError::Terminal(format!("the model's answer is not JSON: {e}")))?;
    let msg = v.pointer("/choices/0/message").ok_or_else(|| {
        ModelError::Terminal("the model's answer has no choices[0].message".into())
    })?;
    let content = msg
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| ModelError::Terminal("a tool call has no function.name".into()))?;
            let args_raw = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            let args = serde_json::from_str(args_raw).unwrap_or_else(|_| json!({"_raw": args_raw}));
            tool_calls.push(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                args,
            });
        }
    }
    let usage = TokenUsage {
        input_tokens: v
            .pointer("/usage/prompt_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        output_tokens: v
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    };
    Ok(ModelReply {
        content,
        tool_calls,
        usage,
    })
}

/// Formats a reply as an OpenAI chat-completions response body (used by the
/// scripted model's server).
pub fn openai_reply_body(model: &str, reply: &ModelReply) -> Value {
    let mut message = json!({"role": "assistant", "content": reply.content});
    if !reply.tool_calls.is_empty() {
        message["tool_calls"] = openai_tool_calls(&reply.tool_calls);
    }
    let finish = if reply.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": reply.usage.input_tokens,
            "completion_tokens": reply.usage.output_tokens,
            "total_tokens": reply.usage.input_tokens + reply.usage.output_tokens
        }
    })
}

/// Parses the messages of an OpenAI chat-completions request.
pub fn parse_openai_request(body: &Value) -> Result<Vec<ChatMessage>, String> {
    let msgs = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages must be an array")?;
    msgs.iter()
        .map(|m| {
            let role = match m.get("role").and_then(Value::as_str) {
                Some("system") | Some("developer") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                Some("tool") => Role::Tool,
                other => return Err(format!("unknown role {other:?}")),
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            };
            let tool_calls = m
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c
                                .get("id")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .into(),
                            name: c
                                .pointer("/function/name")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .into(),
                            args: c
                                .pointer("/function/arguments")
                                .and_then(Value::as_str)
                                .and_then(|a| serde_json::from_str(a).ok())
                                .unwrap_or(json!({})),
                        })
                        .collect()
                })
                .unwrap_or_default();
            Ok(ChatMessage {
                role,
                content,
                tool_calls,
                tool_call_id: m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                name: m.get("name").and_then(Value::as_str).map(str::to_string),
            })
        })
        .collect()
}

fn to_document(v: &Value) -> aws_smithy_types::Document {
    use aws_smithy_types::{Document, Number};
    match v {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Document::Number(Number::PosInt(u))
            } else if let Some(i) = n.as_i64() {
                Document::Number(Number::NegInt(i))
            } else {
                Document::Number(Number::Float(n.as_f64().unwrap_or(0.0)))
            }
        }
        Value::String(s) => Document::String(s.clone()),
        Value::Array(a) => Document::Array(a.iter().map(to_document).collect()),
        Value::Object(o) => {
            Document::Object(o.iter().map(|(k, v)| (k.clone(), to_document(v))).collect())
        }
    }
}

fn from_document(d: &aws_smithy_types::Document) -> Value {
    use aws_smithy_types::{Document, Number};
    match d {
        Document::Null => Value::Null,
        Document::Bool(b) => json!(b),
        Document::Number(Number::PosInt(u)) => json!(u),
        Document::Number(Number::NegInt(i)) => json!(i),
        Document::Number(Number::Float(f)) => json!(f),
        Document::String(s) => json!(s),
        Document::Array(a) => Value::Array(a.iter().map(from_document).collect()),
        Document::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), from_document(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_round_trip_through_the_wire_format() {
        let reply = ModelReply {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "current_time".into(),
                args: json!({"tz": "UTC"}),
            }],
            usage: TokenUsage {
                input_tokens: 3,
                output_tokens: 2,
            },
        };
        let body = openai_reply_body("m", &reply).to_string();
        assert_eq!(parse_openai_reply(&body).unwrap(), reply);
        let req = json!({"messages": [openai_message(&ChatMessage::text(Role::User, "hi"))]});
        assert_eq!(parse_openai_request(&req).unwrap()[0].content, "hi");
    }

    #[test]
    fn documents_round_trip() {
        let v = json!({"a": [1, -2, 1.5, "x", null, true], "b": {}});
        assert_eq!(from_document(&to_document(&v)), v);
    }
}
