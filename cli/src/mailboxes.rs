//! `armada mailboxes …`: a tenant's mailboxes from the command line, read
//! and written through the API's typed views.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use armada_api::mailboxes::{MailPage, MailboxCreated, MailboxView, MailboxesPage};

use crate::client::Client;

#[derive(Subcommand)]
pub enum MailboxesCmd {
    /// Create a mailbox; prints its address (<name>@<the inbound domain>).
    Create {
        /// The address's local part.
        #[arg(long)]
        name: String,
        #[arg(long, conflicts_with = "team")]
        agent: Option<String>,
        #[arg(long)]
        team: Option<String>,
        /// Who may write: addresses and @domains, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        allow: Vec<String>,
        /// A file holding the input template (MiniJinja over mail, mailbox).
        #[arg(long)]
        template: Option<PathBuf>,
        /// Do not mail the Run's answer back.
        #[arg(long)]
        no_reply: bool,
        #[arg(long)]
        max_runs_per_hour: Option<u32>,
        /// Create it disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// The tenant's mailboxes, newest first.
    List,
    /// One mailbox.
    Show { mailbox_id: String },
    /// Change a mailbox: a JSON object of the fields to change, e.g.
    /// '{"enabled": false}' (`null` clears input_template).
    Update { mailbox_id: String, changes: String },
    /// Delete a mailbox: its address takes no more mail.
    Delete { mailbox_id: String },
    /// The mail the mailbox received, newest first, and how each was answered.
    Deliveries {
        mailbox_id: String,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// Carries out `cmd`; what to print.
pub async fn run(c: &Client, cmd: MailboxesCmd) -> Result<Value> {
    let path = |id: &str| format!("/v1/mailboxes/{id}");
    Ok(match cmd {
        MailboxesCmd::Create {
            name,
            agent,
            team,
            allow,
            template,
            no_reply,
            max_runs_per_hour,
            disabled,
        } => {
            let mut body = json!({"name": name, "allow_senders": allow});
            let fields = [
                ("agent", agent.map(Value::from)),
                ("team", team.map(Value::from)),
                ("reply", no_reply.then_some(Value::Bool(false))),
                ("max_runs_per_hour", max_runs_per_hour.map(Value::from)),
                ("enabled", disabled.then_some(Value::Bool(false))),
            ];
            for (field, value) in fields {
                if let Some(v) = value {
                    body[field] = v;
                }
            }
            if let Some(file) = template {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                body["input_template"] = Value::from(text);
            }
            let created: MailboxCreated =
                c.typed(Method::POST, "/v1/mailboxes", Some(&body)).await?;
            serde_json::to_value(created)?
        }
        MailboxesCmd::List => serde_json::to_value(
            c.typed::<MailboxesPage>(Method::GET, "/v1/mailboxes", None)
                .await?,
        )?,
        MailboxesCmd::Show { mailbox_id } => serde_json::to_value(
            c.typed::<MailboxView>(Method::GET, &path(&mailbox_id), None)
                .await?,
        )?,
        MailboxesCmd::Update {
            mailbox_id,
            changes,
        } => {
            let body: Value = serde_json::from_str(&changes).context("changes: not JSON")?;
            let view: MailboxView = c
                .typed(Method::PATCH, &path(&mailbox_id), Some(&body))
                .await?;
            serde_json::to_value(view)?
        }
        MailboxesCmd::Delete { mailbox_id } => {
            c.call(Method::DELETE, &path(&mailbox_id), None, false)
                .await?;
            json!({"mailbox_id": mailbox_id, "deleted": true})
        }
        MailboxesCmd::Deliveries { mailbox_id, limit } => {
            let page: MailPage = c
                .typed(
                    Method::GET,
                    &format!("{}/deliveries?limit={limit}", path(&mailbox_id)),
                    None,
                )
                .await?;
            serde_json::to_value(page)?
        }
    })
}
