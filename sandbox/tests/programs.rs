//! A program a skill brings, run in the jail as the agent runs it: its
//! arguments as JSON on stdin, its answer as JSON on stdout, the
//! environment the harness sealed for it, a secret's value scrubbed from
//! what it answers, its failure with the end of its stderr.

#![allow(clippy::unwrap_used)]

use serde_json::json;

use armada_domain::program::EnvVar;
use armada_sandbox::skills::{self, Judged, Opened};

mod support;

use support::fixture;

const TOKEN: &str = "tok-5e6f7a8b9c";

fn program(script: &str) -> Opened {
    Opened {
        command: vec!["python3".into(), "-c".into(), script.into()],
        env: vec![
            EnvVar {
                name: "CRM_TOKEN".into(),
                value: TOKEN.into(),
                secret: Some("crm-token".into()),
            },
            EnvVar {
                name: "MODE".into(),
                value: "live".into(),
                secret: None,
            },
        ],
    }
}

async fn run(f: &support::Fixture, p: &Opened, args: serde_json::Value) -> serde_json::Value {
    let judged = Judged {
        key: None,
        approved: false,
    };
    skills::invoke_judged(&f.runner, "program", &args, "run_1", 30, judged, Some(p))
        .await
        .result
}

#[tokio::test]
async fn a_json_program_answers_from_its_arguments_and_environment() {
    let f = fixture("workspace");
    let adds = program(
        "import json, os, sys\n\
         a = json.load(sys.stdin)\n\
         print(json.dumps({'sum': a['a'] + a['b'], 'mode': os.environ['MODE'],\n\
                           'token': os.environ['CRM_TOKEN'], 'uid': os.getuid(),\n\
                           'cwd': os.getcwd()}))",
    );
    let r = run(&f, &adds, json!({"a": 2, "b": 3})).await;
    assert_eq!(r["sum"], 5, "{r}");
    assert_eq!(r["mode"], "live");
    assert_eq!(r["token"], "[secret:crm-token]", "the value never leaves");
    assert_eq!(r["uid"], f.runner.env.uid, "as the sandbox's own uid");
    let ws = f.runner.env.workspace().display().to_string();
    assert_eq!(r["cwd"], ws, "in the workspace");

    // Its failure, with what it said; a secret it printed is scrubbed.
    let fails = program(
        "import os, sys\n\
         print('no ticket for', os.environ['CRM_TOKEN'], file=sys.stderr)\n\
         sys.exit(4)",
    );
    let r = run(&f, &fails, json!({})).await;
    assert_eq!(r["error"]["code"], "PROGRAM_FAILED", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("exited 4"), "{message}");
    assert!(
        message.contains("no ticket for [secret:crm-token]"),
        "{message}"
    );

    // Output that is not JSON is the program's fault, said so.
    let chatty = program("print('sum is 5')");
    let r = run(&f, &chatty, json!({})).await;
    assert_eq!(r["error"]["code"], "PROGRAM_OUTPUT", "{r}");

    // The jail holds for it as for any call: nothing outside the workspace.
    let escapes = program("open('/etc/armada-program-test', 'w').write('x')");
    let r = run(&f, &escapes, json!({})).await;
    assert_eq!(r["error"]["code"], "PROGRAM_FAILED", "{r}");
    assert!(!std::path::Path::new("/etc/armada-program-test").exists());
}
