//! Agent definitions, as stored in the registry and sent to `PUT /v1/agents/{name}`.

use serde::{Deserialize, Serialize};

use crate::fields::{FieldError, Fields};
use crate::skills;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelProvider {
    /// The deterministic scripted model, served over the OpenAI wire protocol
    /// at the deployment's configured scripted-model URL.
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Amazon Bedrock, through the Converse API.
    Bedrock,
}

impl ModelProvider {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "scripted" => Some(Self::Scripted),
            "openai" => Some(Self::Openai),
            "bedrock" => Some(Self::Bedrock),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub provider: ModelProvider,
    pub model_id: String,
    /// The model's context window, in tokens.
    pub context_window: u64,
    /// Base URL for `openai` (e.g. `https://api.openai.com/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Name of the environment variable that holds the API key for `openai`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLimits {
    pub max_model_turns: u32,
    pub max_tool_calls: u32,
    /// Wall-clock budget of one Run, in seconds.
    pub timeout_s: u32,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            max_model_turns: 8,
            max_tool_calls: 16,
            timeout_s: 300,
        }
    }
}

/// The caps no agent definition may exceed.
pub const MAX_MODEL_TURNS: u32 = 100;
pub const MAX_TOOL_CALLS: u32 = 500;
pub const MAX_RUN_TIMEOUT_S: u32 = 3600;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentDefinition {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub model: ModelSpec,
    pub system_prompt: String,
    #[serde(default)]
    pub skills: Vec<String>,
    #[serde(default)]
    pub limits: AgentLimits,
    /// Hosts the `http_request` skill may reach.
    #[serde(default)]
    pub http_allow_hosts: Vec<String>,
    /// Incremented by every update.
    #[serde(default)]
    pub version: u64,
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

impl AgentDefinition {
    /// Parses and validates a definition from a request body. `name` comes
    /// from the path and wins over any name in the body.
    pub fn from_json(name: &str, body: &serde_json::Value) -> Result<Self, FieldError> {
        if !valid_name(name) {
            return Err(FieldError::new(
                "name",
                "must be 1-64 characters of a-z, 0-9, '-' or '_'",
            ));
        }
        let f = Fields::new(body)?;
        let model = f.req_obj("model")?;
        let m = Fields::nested(model, "model")?;
        let provider_s = m.req_str("provider")?;
        let provider = ModelProvider::parse(provider_s).ok_or_else(|| {
            FieldError::new("model.provider", "must be one of scripted, openai, bedrock")
        })?;
        let model_id = m.req_str("model_id")?.to_string();
        if model_id.is_empty() {
            return Err(FieldError::new("model.model_id", "must not be empty"));
        }
        let context_window = m.req_u64("context_window")?;
        if !(256..=10_000_000).contains(&context_window) {
            return Err(FieldError::new(
                "model.context_window",
                "must be between 256 and 10000000 tokens",
            ));
        }
        let base_url = m.opt_str("base_url")?.map(str::to_string);
        if provider == ModelProvider::Openai && base_url.is_none() {
            return Err(FieldError::new(
                "model.base_url",
                "is required for the openai provider",
            ));
        }
        let api_key_env = m.opt_str("api_key_env")?.map(str::to_string);
        let system_prompt = f.req_str("system_prompt")?.to_string();
        let description = f.opt_str("description")?.unwrap_or_default().to_string();
        let skills = f.opt_str_list("skills")?.unwrap_or_default();
        for (i, s) in skills.iter().enumerate() {
            if skills::builtin(s).is_none() {
                return Err(FieldError::new(
                    &format!("skills[{i}]"),
                    &format!("unknown skill '{s}'"),
                ));
            }
        }
        let mut limits = AgentLimits::default();
        if let Some(l) = f.opt_obj("limits")? {
            let l = Fields::nested(l, "limits")?;
            if let Some(v) = l.opt_u64("max_model_turns")? {
                limits.max_model_turns = capped(v, MAX_MODEL_TURNS, "limits.max_model_turns")?;
            }
            if let Some(v) = l.opt_u64("max_tool_calls")? {
                limits.max_tool_calls = capped(v, MAX_TOOL_CALLS, "limits.max_tool_calls")?;
            }
            if let Some(v) = l.opt_u64("timeout_s")? {
                limits.timeout_s = capped(v, MAX_RUN_TIMEOUT_S, "limits.timeout_s")?;
            }
        }
        let http_allow_hosts = f.opt_str_list("http_allow_hosts")?.unwrap_or_default();
        Ok(AgentDefinition {
            name: name.to_string(),
            description,
            model: ModelSpec {
                provider,
                model_id,
                context_window,
                base_url,
                api_key_env,
            },
            system_prompt,
            skills,
            limits,
            http_allow_hosts,
            version: 0,
        })
    }
}

fn capped(v: u64, cap: u32, field: &str) -> Result<u32, FieldError> {
    if v == 0 || v > u64::from(cap) {
        return Err(FieldError::new(
            field,
            &format!("must be between 1 and {cap}"),
        ));
    }
    Ok(v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body() -> serde_json::Value {
        json!({
            "model": {"provider": "scripted", "model_id": "scripted-1", "context_window": 4096},
            "system_prompt": "You help.",
            "skills": ["current_time"]
        })
    }

    #[test]
    fn parses_a_minimal_definition_with_defaults() {
        let a = AgentDefinition::from_json("assistant", &body()).unwrap();
        assert_eq!(a.limits, AgentLimits::default());
        assert_eq!(a.model.provider, ModelProvider::Scripted);
    }

    #[test]
    fn names_the_bad_field() {
        let mut b = body();
        b["model"]["context_window"] = json!("big");
        assert_eq!(
            AgentDefinition::from_json("a", &b).unwrap_err().field,
            "model.context_window"
        );
        let mut b = body();
        b["skills"] = json!(["rm_rf"]);
        assert_eq!(
            AgentDefinition::from_json("a", &b).unwrap_err().field,
            "skills[0]"
        );
        assert_eq!(
            AgentDefinition::from_json("Bad Name", &body())
                .unwrap_err()
                .field,
            "name"
        );
        let mut b = body();
        b["limits"] = json!({"max_model_turns": 100000});
        assert_eq!(
            AgentDefinition::from_json("a", &b).unwrap_err().field,
            "limits.max_model_turns"
        );
    }
}
