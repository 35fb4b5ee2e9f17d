//! `armada up --demo`: every scenario the local stack carries, through
//! the HTTP API, as a user would drive it: a single answer (A), a session
//! (F), code in a sandbox, delegation (C), a fan-out team with round 2
//! (D), a relay chain (E) and a lead-driven team (G), each collaboration
//! drawn as its tree.

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use crate::client::Client;
use crate::tree;

fn out(v: &Value) -> &str {
    v["output"].as_str().unwrap_or_default()
}

/// Starts a Run from `body`, waits for it, prints its answer and its tree.
async fn collaborate(c: &Client, body: Value, who: &str) -> Result<Value> {
    let v = c.post("/v1/runs", &body).await?;
    let run_id = crate::client::run_id(&v)?;
    let run = c.wait_run(&run_id, Duration::from_secs(120)).await?;
    println!("  you       {}", body["input"].as_str().unwrap_or_default());
    for (i, l) in out(&run).lines().enumerate() {
        let label = if i == 0 { who } else { "" };
        println!("  {label:<9} {l}");
    }
    let trace = c.get(&format!("/v1/runs/{run_id}/trace")).await?;
    for l in tree::draw(&trace).lines() {
        println!("    {l}");
    }
    Ok(run)
}

pub async fn run(c: &Client) -> Result<()> {
    println!("\n== Scenario A: a single-agent answer");
    let q = "What is Armada?";
    let run_id = c.create_run("assistant", q).await?;
    let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
    println!("  you       {q}");
    println!(
        "  assistant {}   [{} {}]",
        run["output"].as_str().unwrap_or_default(),
        run_id,
        run["state"]
    );
    let run_id = c.create_run("assistant", "/tool current_time {}").await?;
    let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
    println!("  you       /tool current_time {{}}");
    println!("  assistant {}", run["output"].as_str().unwrap_or_default());
    println!("\n== Scenario F: a multi-turn session");
    let sid = c.create_session("assistant").await?;
    for msg in ["My name is Ada.", "I work on compilers.", "/recall"] {
        let run_id = c.send_message(&sid, msg).await?;
        let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
        println!("  you       {msg}");
        println!("  assistant {}", run["output"].as_str().unwrap_or_default());
    }
    let s = c.get(&format!("/v1/sessions/{sid}")).await?;
    println!(
        "  session {sid}: {} turns stored",
        s["turns"].as_array().map(|t| t.len()).unwrap_or(0)
    );
    println!("\n== Code in a sandbox: the coder agent's own confined task");
    let q = r#"/tool shell_exec {"command": "echo 'print(6 * 7)' > answer.py && python3 answer.py && id -u && touch /etc/nope"}"#;
    let run_id = c.create_run("coder", q).await?;
    let run = c.wait_run(&run_id, Duration::from_secs(120)).await?;
    println!("  you       {q}");
    println!("  coder     {}", run["output"].as_str().unwrap_or_default());
    let sb = c.get("/v1/sandboxes/coder").await?;
    println!(
        "  sandbox   {} {} (profile {})",
        sb["state"].as_str().unwrap_or_default(),
        sb["task_arn"].as_str().unwrap_or_default(),
        sb["profile"].as_str().unwrap_or_default()
    );
    if let Some(controls) = sb["controls"].as_object() {
        for (name, c) in controls {
            println!(
                "    {name:<10} {:<12} {}",
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default()
            );
        }
    }
    println!("\n== Scenario C: the orchestrator delegates two parts in parallel");
    let calls = json!([
        {"name": "delegate", "args": {"agent": "researcher", "task": "find three sources on SQS FIFO ordering"}},
        {"name": "delegate", "args": {"agent": "assistant", "task": "outline a one-page summary"}},
    ]);
    collaborate(
        c,
        json!({"agent": "orchestrator", "input": format!("/tools {calls}")}),
        "orchestrator",
    )
    .await?;
    println!("\n== Scenario D: @team:review fans out, then the aggregator answers in round 2");
    collaborate(
        c,
        json!({"input": "@team:review Is this alert a false positive?"}),
        "review",
    )
    .await?;
    println!("\n== Scenario E: the pipeline team relays researcher → assistant");
    let v = c
        .post(
            "/v1/runs",
            &json!({"team": "pipeline", "input": "notes on exactly-once delivery"}),
        )
        .await?;
    let chain_id = v["chain_id"].as_str().unwrap_or_default().to_string();
    let mut chain = json!({});
    for _ in 0..600 {
        chain = c.get(&format!("/v1/chains/{chain_id}")).await?;
        if chain["state"] != "RUNNING" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("  chain     {chain_id} {}", chain["state"]);
    for step in chain["steps"].as_array().cloned().unwrap_or_default() {
        let id = step["run_id"].as_str().unwrap_or_default();
        let run = c.get(&format!("/v1/runs/{id}")).await?;
        println!(
            "    {:<10} {:<10} {}",
            step["agent"].as_str().unwrap_or_default(),
            step["state"].as_str().unwrap_or_default(),
            out(&run)
        );
    }
    println!("\n== Scenario G: the eng team's lead plans, executors run in parallel, the lead consolidates");
    let plan = json!({"tasks": [
        {"agent": "researcher", "task": "collect the failure modes"},
        {"agent": "assistant", "task": "draft the runbook"},
    ]});
    collaborate(
        c,
        json!({"team": "eng", "input": format!("/tool plan {plan}")}),
        "orchestrator",
    )
    .await?;
    println!();
    Ok(())
}
