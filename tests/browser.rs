//! The approval page in a real browser: Debian's Chromium, driven over
//! WebDriver by its ChromeDriver (both installed by `scripts/test`), opens
//! the link from the `.eml`, clicks Approve and sees the result page; the
//! Run then completes. Screenshots of both pages are kept under
//! `target/test-artifacts/`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use armada_tests::approvals::{approvals_of, eml_link, put_agent, put_launch, wait_state};
use armada_tests::sandbox::{fast, tool_result};
use armada_tests::wait::eventually;
use armada_tests::{free_port, outcome, root, TestStack};

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A ChromeDriver process and one headless Chromium session.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: PathBuf,
}

impl Browser {
    async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new(which("chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts (scripts/test installs Debian's chromium-driver)");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        eventually("chromedriver to answer", || async {
            http.get(format!("{base}/status")).send().await.is_ok()
        })
        .await;
        let profile = std::env::temp_dir().join(format!("armada-chromium-{port}"));
        // Flags for a closed network: no background connections at all.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1000,1000",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": which("chromium"), "args": args}
        }}});
        let v: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {v}"))
            .to_string();
        Browser {
            driver,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let v = self.answer(method, path, body).await;
        assert!(v["value"]["error"].is_null(), "WebDriver {path}: {v}");
        v["value"].clone()
    }

    /// WebDriver's whole answer, an error included.
    async fn answer(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.unwrap().json().await.unwrap()
    }

    async fn open(&self, url: &str) {
        self.call(Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The element `css` selects, once the page shows it: after a click
    /// the next page may still be loading (a busy machine takes seconds).
    async fn find(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let v = self
                .answer(
                    Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            if let Some(el) = v["value"][ELEMENT].as_str() {
                return el.to_string();
            }
            let missing = v["value"]["error"] == "no such element";
            assert!(
                missing && std::time::Instant::now() < deadline,
                "WebDriver finding {css}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn text(&self, css: &str) -> String {
        let el = self.find(css).await;
        let v = self
            .call(Method::GET, &format!("/element/{el}/text"), None)
            .await;
        v.as_str().unwrap_or_default().to_string()
    }

    async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.call(
            Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn screenshot(&self, file: &Path) {
        let v = self.call(Method::GET, "/screenshot", None).await;
        let png = aws_smithy_types::base64::decode(v.as_str().unwrap()).unwrap();
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, png).unwrap();
    }

    async fn close(mut self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = self.http.delete(url).send().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn which(program: &str) -> String {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(program);
        if p.exists() {
            return p.display().to_string();
        }
    }
    panic!(
        "{program} is not installed: scripts/test installs Debian's chromium and chromium-driver"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_approves_in_a_real_browser_from_the_emails_link() {
    let t = TestStack::start_with(fast(), None).await;
    put_launch(&t).await;
    let approvals = json!({"approvers": ["ops@example.com"]});
    put_agent(&t, "launcher", &["launch"], approvals, json!({})).await;
    let id = t
        .client
        .create_run("launcher", r#"/tool launch {"target": "production"}"#)
        .await
        .unwrap();

    // The link, as the approver's mail client shows it.
    wait_state(&t.client, &id, "AWAITING_HITL").await;
    let approval_id = approvals_of(&t.client, &id).await.remove(0);
    let link = eml_link(&t.outbox, &approval_id).await;

    let artifacts = root().join("target/test-artifacts");
    let browser = Browser::start().await;
    browser.open(&link).await;
    let page = browser.text("main").await;
    for part in ["launcher", "launch", "production", id.as_str(), "high"] {
        assert!(page.contains(part), "{part} not on the page: {page}");
    }
    browser
        .screenshot(&artifacts.join("approval-page.png"))
        .await;
    browser.click("#approve").await;
    let result = browser.text("#result").await;
    assert!(result.contains("approved"), "{result}");
    browser
        .screenshot(&artifacts.join("approval-result.png"))
        .await;
    browser.close().await;

    let run = t
        .client
        .wait_run(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome(&run), "COMPLETED", "{run:?}");
    assert!(tool_result(&run, "launch")["now"].is_string(), "{run:?}");
    t.stack.stop().await;
}
