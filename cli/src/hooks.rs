//! `armada hooks …`: a tenant's inbound webhooks from the command line,
//! read and written through the API's typed views.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use armada_api::hooks::{DeliveriesPage, HookCreated, HookSecret, HookView, HooksPage};

use crate::client::Client;

#[derive(Subcommand)]
pub enum HooksCmd {
    /// Create a hook; prints its URL and its secret (shown this once), or
    /// for a cloudwatch hook the SNS topic its alarms' actions name.
    Create {
        /// github, standard, alertmanager or cloudwatch.
        #[arg(long)]
        kind: String,
        #[arg(long, conflicts_with_all = ["team", "chain"])]
        agent: Option<String>,
        #[arg(long, conflicts_with = "chain")]
        team: Option<String>,
        /// A relay chain of agents, comma-separated.
        #[arg(long, value_delimiter = ',')]
        chain: Option<Vec<String>>,
        /// A file holding the input template (MiniJinja over event, payload, hook).
        #[arg(long)]
        template: Option<PathBuf>,
        #[arg(long)]
        callback_url: Option<String>,
        /// github: the events that start a Run, comma-separated.
        #[arg(long, value_delimiter = ',')]
        events: Option<Vec<String>>,
        /// cloudwatch: the alarms that start a Run, comma-separated.
        #[arg(long, value_delimiter = ',')]
        alarm_names: Option<Vec<String>>,
        /// alertmanager, cloudwatch: `run` to start a Run for resolved
        /// notifications (an alarm back to OK) too.
        #[arg(long)]
        on_resolved: Option<String>,
        #[arg(long)]
        max_runs_per_hour: Option<u32>,
        /// Create it disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// The tenant's hooks, newest first.
    List,
    /// One hook (never its secret).
    Show { hook_id: String },
    /// Change a hook: a JSON object of the fields to change, e.g.
    /// '{"enabled": false}' (`null` clears an optional field).
    Update { hook_id: String, changes: String },
    /// Delete a hook: its URL answers 404 from now on.
    Delete { hook_id: String },
    /// A new secret (printed once); the old one stops verifying.
    Rotate { hook_id: String },
    /// The hook's verified deliveries, newest first, and how each was answered.
    Deliveries {
        hook_id: String,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// Carries out `cmd`; what to print.
pub async fn run(c: &Client, cmd: HooksCmd) -> Result<Value> {
    let path = |id: &str| format!("/v1/hooks/{id}");
    Ok(match cmd {
        HooksCmd::Create {
            kind,
            agent,
            team,
            chain,
            template,
            callback_url,
            events,
            alarm_names,
            on_resolved,
            max_runs_per_hour,
            disabled,
        } => {
            let mut body = json!({"kind": kind});
            let fields = [
                ("agent", agent.map(Value::from)),
                ("team", team.map(Value::from)),
                ("chain", chain.map(Value::from)),
                ("callback_url", callback_url.map(Value::from)),
                ("events", events.map(Value::from)),
                ("alarm_names", alarm_names.map(Value::from)),
                ("on_resolved", on_resolved.map(Value::from)),
                ("max_runs_per_hour", max_runs_per_hour.map(Value::from)),
                ("enabled", disabled.then_some(Value::Bool(false))),
            ];
            for (name, value) in fields {
                if let Some(v) = value {
                    body[name] = v;
                }
            }
            if let Some(file) = template {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                body["input_template"] = Value::from(text);
            }
            let created: HookCreated = c.typed(Method::POST, "/v1/hooks", Some(&body)).await?;
            serde_json::to_value(created)?
        }
        HooksCmd::List => {
            serde_json::to_value(c.typed::<HooksPage>(Method::GET, "/v1/hooks", None).await?)?
        }
        HooksCmd::Show { hook_id } => serde_json::to_value(
            c.typed::<HookView>(Method::GET, &path(&hook_id), None)
                .await?,
        )?,
        HooksCmd::Update { hook_id, changes } => {
            let body: Value = serde_json::from_str(&changes).context("changes: not JSON")?;
            let view: HookView = c.typed(Method::PATCH, &path(&hook_id), Some(&body)).await?;
            serde_json::to_value(view)?
        }
        HooksCmd::Delete { hook_id } => {
            c.call(Method::DELETE, &path(&hook_id), None, false).await?;
            json!({"hook_id": hook_id, "deleted": true})
        }
        HooksCmd::Rotate { hook_id } => {
            let rotated: HookSecret = c
                .typed(Method::POST, &format!("{}/rotate", path(&hook_id)), None)
                .await?;
            serde_json::to_value(rotated)?
        }
        HooksCmd::Deliveries { hook_id, limit } => {
            let page: DeliveriesPage = c
                .typed(
                    Method::GET,
                    &format!("{}/deliveries?limit={limit}", path(&hook_id)),
                    None,
                )
                .await?;
            serde_json::to_value(page)?
        }
    })
}
