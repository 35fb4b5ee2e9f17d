//! A skill whose program is an MCP server (`program.protocol: mcp`) is
//! offered to a model as the server's tools, each `<skill>__<tool>` with
//! the schema and annotations its manifest froze: a manifest of its own
//! per tool, run by the skill's program in the sandbox, its risk and
//! whether it may be repeated decided by its annotations as a remote MCP
//! server's tools are.

use crate::mcp::{cut, model_safe, ListedTool, MAX_DESCRIPTION, SEPARATOR};
use crate::program::{ProgramProtocol, Served};
use crate::skills::{SkillManifest, ToolHints};

/// Whether `m` is a skill whose program is an MCP server.
pub fn is_server(m: &SkillManifest) -> bool {
    m.program
        .as_ref()
        .is_some_and(|p| p.protocol == ProgramProtocol::Mcp && p.serves.is_none())
}

/// The tools a skill's MCP program offers, as manifests named as the
/// model is offered them (nothing for any other skill).
pub fn served_tools(skill: &str, m: &SkillManifest) -> Vec<SkillManifest> {
    let Some(p) = m.program.as_ref().filter(|_| is_server(m)) else {
        return vec![];
    };
    p.tools
        .iter()
        .filter_map(ListedTool::from_wire)
        .map(|tool| {
            let description = tool
                .description
                .clone()
                .or_else(|| tool.title.clone())
                .unwrap_or_else(|| tool.name.clone());
            let mut program = p.clone();
            program.tools.clear();
            program.serves = Some(Served {
                skill: skill.to_string(),
                tool: tool.name.clone(),
            });
            SkillManifest {
                name: served_name(skill, &tool.name),
                description: cut(&description, MAX_DESCRIPTION),
                risk: ToolHints::risk(tool.hints.as_ref()),
                idempotent: ToolHints::repeatable(tool.hints.as_ref()),
                parameters: tool.input_schema.clone(),
                program: Some(program),
                ..m.clone()
            }
        })
        .collect()
}

/// The name a model calls a served tool by.
pub fn served_name(skill: &str, tool: &str) -> String {
    format!("{skill}{SEPARATOR}{}", model_safe(tool))
}

#[cfg(test)]
#[path = "served_tests.rs"]
mod tests;
