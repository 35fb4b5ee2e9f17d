//! Sequential relay chains on the real emulator (scenario E): each step
//! gets the one before's output, a failure or a timeout breaks the chain
//! (the steps after it skipped, the ones before it intact), the chain's
//! callback hears its end once, a chain is cancelled through its running
//! step, and a relay team runs as a chain.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_api::collab::{ChainView, TraceView};
use armada_domain::collab::chain::ChainState;
use armada_domain::collab::RunKind;
use armada_tests::{callback_receiver, error_code, wait, TestStack};

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

async fn start_chain(t: &TestStack, body: Value) -> (String, String) {
    let v = t.client.post("/v1/runs", &body).await.unwrap();
    (text(&v["run_id"]), text(&v["chain_id"]))
}

/// Waits until the chain is no longer RUNNING; its view.
async fn wait_chain(t: &TestStack, chain_id: &str) -> ChainView {
    let what = format!("chain {chain_id} to end");
    let path = format!("/v1/chains/{chain_id}");
    wait::until(&what, Duration::from_secs(60), || async {
        let v: ChainView = t.client.typed(Method::GET, &path, None).await.unwrap();
        (v.state != ChainState::Running).then_some(v)
    })
    .await
}

fn step_states(chain: &ChainView) -> Vec<&str> {
    chain.steps.iter().map(|s| s.state.as_str()).collect()
}

/// Step `i`'s Run.
fn step_run(chain: &ChainView, i: usize) -> String {
    chain.steps[i].run_id.clone().expect("the step's Run")
}

/// An agent on a model endpoint that accepts and never answers.
async fn put_hanging_agent(
    t: &TestStack,
    name: &str,
    timeout_s: u32,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            open.push(s);
        }
    });
    let def = json!({
        "model": {"provider": "openai", "model_id": "x", "context_window": 4096, "base_url": url},
        "system_prompt": "silent",
        "limits": {"timeout_s": timeout_s},
    });
    t.admin
        .call(Method::PUT, &format!("/v1/agents/{name}"), Some(&def), true)
        .await
        .unwrap();
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_e_each_step_gets_the_previous_output_and_the_callback_hears_the_end_once() {
    let t = TestStack::start().await;
    let (url, mut rx) = callback_receiver(vec![200]).await;
    let body = json!({"chain": ["researcher", "assistant", "researcher"], "input": "the topic", "callback_url": url});
    let (first, chain_id) = start_chain(&t, body).await;
    assert!(chain_id.starts_with("chain_"), "{chain_id}");
    let first_view = t.client.get(&format!("/v1/runs/{first}")).await.unwrap();
    assert_eq!(first_view["chain_id"], chain_id.as_str());
    assert_eq!(
        first_view["chain_remaining"],
        json!(["assistant", "researcher"])
    );
    let chain = wait_chain(&t, &chain_id).await;
    assert_eq!(chain.state, ChainState::Completed, "{chain:?}");
    assert_eq!(step_states(&chain), ["COMPLETED"; 3]);
    let last_id = step_run(&chain, 2);
    let last = t.wait_closed(&last_id).await;
    assert_eq!(last.output.as_deref(), Some("echo: echo: echo: the topic"));
    assert!(last.parent_run_id.is_none(), "peers: no parent");
    assert_eq!(last.chain_remaining, Some(vec![]));
    let request = rx.recv().await.unwrap();
    assert_eq!(request.header("webhook-id"), chain_id);
    assert_eq!(request.header("x-armada-delivery"), chain_id);
    let heard: Value = serde_json::from_str(&request.body).unwrap();
    assert_eq!(heard["state"], "COMPLETED");
    assert_eq!(heard["output"], "echo: echo: echo: the topic");
    // Every message handled: a second delivery would have been sent.
    armada_tests::wait::drained(&t).await;
    assert!(rx.try_recv().is_err(), "heard once");
    // The trace of any step lists the chain's steps in order.
    let trace: TraceView = t
        .client
        .typed(Method::GET, &format!("/v1/runs/{last_id}/trace"), None)
        .await
        .unwrap();
    let ids: Vec<String> = trace.runs.iter().map(|r| r.run_id.clone()).collect();
    let steps: Vec<String> = (0..chain.steps.len())
        .map(|i| step_run(&chain, i))
        .collect();
    assert_eq!(ids, steps);
    assert!(trace.runs.iter().all(|r| r.kind == RunKind::ChainStep));

    // A relay team is a chain of its members.
    let team = json!({"members": ["assistant", "researcher"], "strategy": "relay"});
    t.admin
        .call(Method::PUT, "/v1/teams/pipe", Some(&team), true)
        .await
        .unwrap();
    let (_, chain_id) = start_chain(&t, json!({"team": "pipe", "input": "go"})).await;
    let chain = wait_chain(&t, &chain_id).await;
    assert_eq!(
        (chain.state, chain.team.as_deref()),
        (ChainState::Completed, Some("pipe"))
    );
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_or_timed_out_middle_step_breaks_the_chain_and_keeps_what_came_before() {
    let t = TestStack::start().await;
    let broken = json!({
        "model": {"provider": "openai", "model_id": "x", "context_window": 4096, "base_url": "http://127.0.0.1:9/v1"},
        "system_prompt": "unreachable",
    });
    t.admin
        .call(Method::PUT, "/v1/agents/broken", Some(&broken), true)
        .await
        .unwrap();
    let _held = put_hanging_agent(&t, "hang", 2).await;
    let (url, mut rx) = callback_receiver(vec![200]).await;
    for (middle, ended) in [("broken", "FAILED"), ("hang", "TIMED_OUT")] {
        let body = json!({"chain": ["assistant", middle, "assistant"], "input": "part one", "callback_url": url});
        let (first, chain_id) = start_chain(&t, body).await;
        let chain = wait_chain(&t, &chain_id).await;
        assert_eq!(chain.state, ChainState::Failed, "{chain:?}");
        assert_eq!(
            step_states(&chain),
            ["COMPLETED", ended, "SKIPPED"],
            "{chain:?}"
        );
        assert!(chain.steps[2].run_id.is_none());
        // The completed step's output is still there.
        let kept = t.client.get(&format!("/v1/runs/{first}")).await.unwrap();
        assert_eq!(kept["output"], "echo: part one");
        let middle_id = step_run(&chain, 1);
        t.wait_closed(&middle_id).await;
        let types = t.event_types(&middle_id).await;
        assert!(types.contains(&"chain_broken".to_string()), "{types:?}");
        let request = rx.recv().await.unwrap();
        assert_eq!(request.header("webhook-id"), chain_id);
        let heard: Value = serde_json::from_str(&request.body).unwrap();
        assert_eq!(heard["state"], "FAILED");
        assert_eq!(heard["steps"][2]["state"], "SKIPPED");
    }
    t.stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_chain_cancels_its_running_step_and_skips_the_rest() {
    let t = TestStack::start().await;
    let body =
        json!({"chain": ["assistant", "researcher", "assistant"], "input": "/sleep 5000 slow"});
    let (first, chain_id) = start_chain(&t, body).await;
    let client = &t.client;
    armada_tests::wait::eventually("the first step is executing", || async {
        client
            .get(&format!("/v1/runs/{first}"))
            .await
            .is_ok_and(|v| v["state"] == "EXECUTING")
    })
    .await;
    let v = t
        .client
        .post(&format!("/v1/chains/{chain_id}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_eq!(v["cancelled_run_id"], first.as_str());
    let chain = wait_chain(&t, &chain_id).await;
    assert_eq!(chain.state, ChainState::Cancelled);
    assert_eq!(step_states(&chain), ["CANCELLED", "SKIPPED", "SKIPPED"]);
    let (status, body) = t
        .raw(
            Method::POST,
            &format!("/v1/chains/{chain_id}/cancel"),
            Some(&t.stack.tenant_key),
            Some("{}"),
            &[],
        )
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (409, Some("CHAIN_ENDED".to_string()))
    );
    let (status, _) = t
        .raw(
            Method::GET,
            "/v1/chains/chain_nope",
            Some(&t.stack.tenant_key),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404);
    t.stack.stop().await;
}
