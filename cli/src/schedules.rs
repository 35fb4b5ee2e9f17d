//! `armada schedules …`: a tenant's schedules from the command line, read
//! and written through the API's typed views.

use anyhow::{Context, Result};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use armada_api::schedules::{FiringsPage, ScheduleCreated, ScheduleView, SchedulesPage};

use crate::client::Client;

#[derive(Subcommand)]
pub enum SchedulesCmd {
    /// Create a schedule; prints its next five firings.
    Create {
        /// cron(...), rate(...) or at(...), as EventBridge Scheduler takes them.
        #[arg(long)]
        expression: String,
        /// An IANA time zone (default UTC).
        #[arg(long)]
        timezone: Option<String>,
        #[arg(long, conflicts_with_all = ["team", "chain"])]
        agent: Option<String>,
        #[arg(long, conflicts_with = "chain")]
        team: Option<String>,
        #[arg(long, value_delimiter = ',')]
        chain: Option<Vec<String>>,
        /// What each firing's Run is asked.
        #[arg(long)]
        input: String,
        #[arg(long)]
        callback_url: Option<String>,
        /// skip (default) or allow.
        #[arg(long)]
        overlap: Option<String>,
        /// Create it disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// The tenant's schedules with their next firings.
    List,
    /// One schedule.
    Show { schedule_id: String },
    /// Change a schedule: a JSON object of the fields to change.
    Update {
        schedule_id: String,
        changes: String,
    },
    /// Delete a schedule and its timer.
    Delete { schedule_id: String },
    /// The schedule's firings, newest first.
    Firings {
        schedule_id: String,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// Carries out `cmd`; what to print.
pub async fn run(c: &Client, cmd: SchedulesCmd) -> Result<Value> {
    let path = |id: &str| format!("/v1/schedules/{id}");
    Ok(match cmd {
        SchedulesCmd::Create {
            expression,
            timezone,
            agent,
            team,
            chain,
            input,
            callback_url,
            overlap,
            disabled,
        } => {
            let mut body = json!({"expression": expression, "input": input});
            let fields = [
                ("timezone", timezone.map(Value::from)),
                ("agent", agent.map(Value::from)),
                ("team", team.map(Value::from)),
                ("chain", chain.map(Value::from)),
                ("callback_url", callback_url.map(Value::from)),
                ("overlap", overlap.map(Value::from)),
                ("enabled", disabled.then_some(Value::Bool(false))),
            ];
            for (name, value) in fields {
                if let Some(v) = value {
                    body[name] = v;
                }
            }
            let created: ScheduleCreated =
                c.typed(Method::POST, "/v1/schedules", Some(&body)).await?;
            serde_json::to_value(created)?
        }
        SchedulesCmd::List => serde_json::to_value(
            c.typed::<SchedulesPage>(Method::GET, "/v1/schedules", None)
                .await?,
        )?,
        SchedulesCmd::Show { schedule_id } => serde_json::to_value(
            c.typed::<ScheduleView>(Method::GET, &path(&schedule_id), None)
                .await?,
        )?,
        SchedulesCmd::Update {
            schedule_id,
            changes,
        } => {
            let body: Value = serde_json::from_str(&changes).context("changes: not JSON")?;
            let view: ScheduleView = c
                .typed(Method::PATCH, &path(&schedule_id), Some(&body))
                .await?;
            serde_json::to_value(view)?
        }
        SchedulesCmd::Delete { schedule_id } => {
            c.call(Method::DELETE, &path(&schedule_id), None, false)
                .await?;
            json!({"schedule_id": schedule_id, "deleted": true})
        }
        SchedulesCmd::Firings { schedule_id, limit } => {
            let page: FiringsPage = c
                .typed(
                    Method::GET,
                    &format!("{}/firings?limit={limit}", path(&schedule_id)),
                    None,
                )
                .await?;
            serde_json::to_value(page)?
        }
    })
}
