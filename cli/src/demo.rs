//! `armada up --demo`: every scenario the local stack carries, through
//! the HTTP API, as a user would drive it: a single answer (A), a session
//! (F), code in a sandbox, a destructive command approved by a person
//! through the emailed link (B), delegation (C), a fan-out team with round
//! 2 (D), a relay chain (E) and a lead-driven team (G), each collaboration
//! drawn as its tree, and unattended agents (H): a signed GitHub push
//! starting a review through a hook, a schedule firing, and an email
//! answered in its thread.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use armada_api::collab::ChainView;
use armada_api::hooks::{DeliveryAnswer, HookCreated};
use armada_api::runs::{RunAccepted, RunView};
use armada_api::schedules::{FiringsPage, ScheduleCreated};
use armada_domain::collab::chain::ChainState;
use armada_domain::crypto::hmac_sha256_hex;
use reqwest::Method;

use crate::client::Client;
use crate::tree;

fn out(run: &RunView) -> &str {
    run.output.as_deref().unwrap_or_default()
}

/// Starts a Run from `body`, waits for it, prints its answer and its tree.
async fn collaborate(c: &Client, body: Value, who: &str) -> Result<RunView> {
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

/// Scenario B: the operator's `rm -rf` waits for a person, who opens the
/// link from the email in the outbox and approves.
async fn approval(c: &Client, outbox: &Path) -> Result<()> {
    println!("\n== Scenario B: a destructive command waits for a person's approval");
    let q = r#"/tool shell_exec {"command": "mkdir -p build && touch build/app && rm -rf build && echo cleaned"}"#;
    let run_id = c.create_run("operator", q).await?;
    println!("  you       {q}");
    let mut link = None;
    for _ in 0..600 {
        let run = c.get(&format!("/v1/runs/{run_id}")).await?;
        if run["state"] == "AWAITING_HITL" {
            link = std::fs::read_dir(outbox)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter(|t| t.contains(&run_id))
                .find_map(|t| {
                    t.lines()
                        .find(|l| l.contains("/review?token="))
                        .map(|l| l.trim().to_string())
                });
            if link.is_some() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let Some(link) = link else {
        bail!("run {run_id} did not ask for an approval by email");
    };
    println!(
        "  operator  AWAITING_HITL; an email to ops@example.com in {}",
        outbox.display()
    );
    println!("  link      {link}");
    let (page, token) = link
        .split_once("/review?token=")
        .ok_or_else(|| anyhow!("not a review link: {link}"))?;
    // What the page's Approve button sends.
    let resp = reqwest::Client::new()
        .post(format!("{page}/review"))
        .form(&[("token", token), ("decision", "approve"), ("comment", "")])
        .send()
        .await?;
    println!(
        "  you       (open the link, press Approve: HTTP {})",
        resp.status().as_u16()
    );
    let run = c.wait_run(&run_id, Duration::from_secs(120)).await?;
    println!("  operator  {}", out(&run));
    Ok(())
}

pub async fn run(c: &Client, outbox: Option<&Path>, smtp: &str) -> Result<()> {
    println!("\n== Scenario A: a single-agent answer");
    let q = "What is Armada?";
    let run_id = c.create_run("assistant", q).await?;
    let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
    println!("  you       {q}");
    println!("  assistant {}   [{} {}]", out(&run), run_id, run.state);
    let run_id = c.create_run("assistant", "/tool current_time {}").await?;
    let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
    println!("  you       /tool current_time {{}}");
    println!("  assistant {}", out(&run));
    println!("\n== Scenario F: a multi-turn session");
    let sid = c.create_session("assistant").await?;
    for msg in ["My name is Ada.", "I work on compilers.", "/recall"] {
        let run_id = c.send_message(&sid, msg).await?;
        let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
        println!("  you       {msg}");
        println!("  assistant {}", out(&run));
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
    println!("  coder     {}", out(&run));
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
    if let Some(dir) = outbox {
        approval(c, dir).await?;
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
    let body = json!({"team": "pipeline", "input": "notes on exactly-once delivery"});
    let accepted: RunAccepted = c.typed(Method::POST, "/v1/runs", Some(&body)).await?;
    let chain_id = accepted
        .chain_id
        .ok_or_else(|| anyhow!("the pipeline team's run is no chain"))?;
    let mut chain: ChainView;
    loop {
        chain = c
            .typed(Method::GET, &format!("/v1/chains/{chain_id}"), None)
            .await?;
        if chain.state != ChainState::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("  chain     {chain_id} {:?}", chain.state);
    for step in &chain.steps {
        let id = step.run_id.as_deref().unwrap_or_default();
        let run = c.run(id).await?;
        println!("    {:<10} {:<10} {}", step.agent, step.state, out(&run));
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
    webhook(c).await?;
    if let Some(outbox) = outbox {
        email(c, smtp, outbox).await?;
    }
    println!();
    Ok(())
}

/// Scenario H: a GitHub push, signed as GitHub signs it, starts a review
/// through a hook; no API key is sent with it.
async fn webhook(c: &Client) -> Result<()> {
    println!("\n== Scenario H: a signed GitHub push starts a review through a hook");
    let body = json!({"kind": "github", "agent": "assistant", "events": ["push"],
        "input_template": "Review the push to {{ payload.repository.full_name }} at {{ payload.after }}."});
    let hook: HookCreated = c.typed(Method::POST, "/v1/hooks", Some(&body)).await?;
    println!("  hook      {} ({})", hook.hook_id, hook.url);
    let push = json!({"ref": "refs/heads/main", "after": "5f2c9e1",
        "repository": {"full_name": "octo/hello"}})
    .to_string();
    let secret = hook
        .secret
        .ok_or_else(|| anyhow!("a github hook came without its secret"))?;
    let signature = hmac_sha256_hex(secret.as_bytes(), push.as_bytes());
    let resp = reqwest::Client::new()
        .post(&hook.url)
        .header("x-github-event", "push")
        .header("x-github-delivery", armada_core::clock::new_id("demo"))
        .header("x-hub-signature-256", format!("sha256={signature}"))
        .body(push)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let answer: DeliveryAnswer = resp.json().await?;
    let Some(run_id) = answer.run_id else {
        bail!("the push started nothing ({status}): {answer:?}");
    };
    let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
    println!("  github    push to octo/hello ({status})");
    println!("  input     {}", run.input.as_deref().unwrap_or_default());
    println!("  assistant {}   [{run_id} {}]", out(&run), run.state);
    schedule(c).await
}

/// Scenario H, on a timer: an `at` schedule two seconds ahead fires once
/// (the local stack fires EventBridge Scheduler's schedules itself).
async fn schedule(c: &Client) -> Result<()> {
    println!("\n== Scenario H: a schedule fires");
    let at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let expression = format!("at({})", at.format("%Y-%m-%dT%H:%M:%S"));
    let body =
        json!({"expression": expression, "agent": "assistant", "input": "the nightly summary"});
    let created: ScheduleCreated = c.typed(Method::POST, "/v1/schedules", Some(&body)).await?;
    println!(
        "  schedule  {} {expression} (next {:?})",
        created.schedule_id, created.next
    );
    let path = format!("/v1/schedules/{}/firings", created.schedule_id);
    for _ in 0..600 {
        let page: FiringsPage = c.typed(Method::GET, &path, None).await?;
        if let Some(run_id) = page.firings.first().and_then(|f| f.run_id.clone()) {
            let run = c.wait_run(&run_id, Duration::from_secs(60)).await?;
            println!("  fired     {}", page.firings[0].scheduled_at);
            println!("  assistant {}   [{run_id} {}]", out(&run), run.state);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the schedule never fired")
}

/// Says one SMTP command (or the message, for `None`) and reads the
/// answer, which must have the status `want`.
async fn smtp_step(
    conn: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    say: Option<&str>,
    want: &str,
) -> Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    if let Some(line) = say {
        conn.get_mut().write_all(line.as_bytes()).await?;
    }
    let mut answer = String::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await? == 0 {
            bail!("the SMTP listener hung up");
        }
        answer.push_str(&line);
        // A multi-line answer goes on while its code is followed by '-'.
        if line.as_bytes().get(3) != Some(&b'-') {
            break;
        }
    }
    if !answer.starts_with(want) {
        bail!("SMTP: {say:?} was answered {answer:?}");
    }
    Ok(answer)
}

/// Scenario H by mail: Alice writes to a mailbox over SMTP (the local
/// stack's listener stands for SES); the answer comes back in her thread.
async fn email(c: &Client, smtp: &str, outbox: &Path) -> Result<()> {
    use armada_api::mailboxes::MailboxCreated;
    use armada_domain::mailbox::mail::InboundMail;
    println!("\n== Scenario H: an email is answered in its thread");
    // A name of its own each time: the emulator may hold an earlier demo's.
    let id = armada_core::clock::new_id("d");
    let name = format!("billing-{}", &id[id.len() - 8..]).to_lowercase();
    let body = json!({"name": name, "agent": "assistant", "allow_senders": ["alice@example.com"],
        "input_template": "{{ mail.text | trim }}"});
    let mailbox: MailboxCreated = c.typed(Method::POST, "/v1/mailboxes", Some(&body)).await?;
    println!("  mailbox   {} ({})", mailbox.address, mailbox.mailbox_id);
    let message_id = format!("{}@example.com", armada_core::clock::new_id("demo"));
    let message = format!(
        "From: Alice <alice@example.com>\r\nTo: {to}\r\nSubject: March invoice\r\n\
         Message-ID: <{message_id}>\r\n\r\nWhere is the March invoice?\r\n.\r\n",
        to = mailbox.address
    );
    let stream = tokio::net::TcpStream::connect(smtp).await?;
    let mut conn = tokio::io::BufReader::new(stream);
    smtp_step(&mut conn, None, "220").await?;
    smtp_step(&mut conn, Some("EHLO demo.example.com\r\n"), "250").await?;
    smtp_step(&mut conn, Some("MAIL FROM:<alice@example.com>\r\n"), "250").await?;
    let rcpt = format!("RCPT TO:<{}>\r\n", mailbox.address);
    smtp_step(&mut conn, Some(&rcpt), "250").await?;
    smtp_step(&mut conn, Some("DATA\r\n"), "354").await?;
    let queued = smtp_step(&mut conn, Some(&message), "250").await?;
    smtp_step(&mut conn, Some("QUIT\r\n"), "221").await?;
    println!(
        "  alice     Where is the March invoice?   [{}]",
        queued.trim()
    );
    for _ in 0..600 {
        let reply = std::fs::read_dir(outbox)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| InboundMail::parse(&b, None).ok())
            .find(|m| m.in_reply_to.contains(&message_id));
        if let Some(r) = reply {
            println!("  reply     {} (In-Reply-To <{message_id}>)", r.subject);
            println!("  assistant {}", r.text.trim());
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the email was never answered")
}
