//! The API's OpenAPI document: ingress's routes and the approvals', merged
//! (each function builds its part from the `routes!` that build its
//! router). `docs/openapi.json` is its committed copy, which ingress
//! serves at `GET /v1/openapi.json`; `armada openapi` prints it.

use utoipa::openapi::OpenApi;

/// The whole document.
pub fn document() -> OpenApi {
    let mut doc = armada_ingress::openapi();
    doc.merge(armada_hitl::openapi());
    doc
}

/// The document as committed: pretty JSON, one trailing newline.
pub fn document_json() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::path::PathBuf;

    use super::*;
    use crate::local::template::Template;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// `docs/openapi.json` is what the routers describe; with
    /// `UPDATE_OPENAPI=1` this rewrites it instead of failing.
    #[test]
    fn the_committed_document_is_the_generated_one() {
        let path = repo().join("docs/openapi.json");
        let generated = document_json();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &generated).expect("docs/openapi.json written");
        }
        let committed = std::fs::read_to_string(&path).expect("docs/openapi.json");
        assert!(
            committed == generated,
            "docs/openapi.json differs from what the routers describe: \
             run `UPDATE_OPENAPI=1 cargo test -p armada-cli openapi` and commit it"
        );
    }

    /// Every operation of the document is a route of the template, and
    /// every route of the template (but the catch-alls that let the
    /// routers answer 404 and 405 themselves) an operation.
    #[test]
    fn the_template_routes_exactly_the_documented_operations() {
        let text = std::fs::read_to_string(repo().join("infra/template.yaml")).expect("template");
        let template = Template::parse(&text, "armada", "us-east-1", &HashMap::new())
            .expect("the template parses");
        let routed: BTreeSet<(String, String)> = template
            .routes()
            .into_iter()
            .filter(|r| r.method != "ANY")
            .map(|r| (r.method, r.path))
            .collect();
        let doc = serde_json::to_value(document()).expect("document as JSON");
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "put", "post", "delete", "patch"].contains(&method.as_str()) {
                    documented.insert((method.to_ascii_uppercase(), path.clone()));
                }
            }
        }
        let missing: Vec<_> = documented.difference(&routed).collect();
        let undocumented: Vec<_> = routed.difference(&documented).collect();
        assert!(
            missing.is_empty() && undocumented.is_empty(),
            "documented but not routed by the template: {missing:?}; \
             routed but not documented: {undocumented:?}"
        );
    }

    /// Every operation names its success and error bodies, and every
    /// operation that takes a key says which.
    #[test]
    fn every_operation_names_its_answers_and_keys() {
        let doc = serde_json::to_value(document()).expect("document as JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                let id = format!("{method} {path}");
                let responses = op["responses"].as_object().expect("responses");
                assert!(
                    responses.keys().any(|s| s.starts_with('2')),
                    "{id}: no success answer"
                );
                for (status, r) in responses {
                    assert!(
                        r["description"].as_str().is_some_and(|d| !d.is_empty()),
                        "{id} {status}: no description"
                    );
                }
                let open =
                    path == "/v1/health" || path == "/v1/openapi.json" || path.ends_with("/review");
                if !open {
                    assert!(op["security"].is_array(), "{id}: no security");
                    assert!(responses.contains_key("401"), "{id}: no 401");
                }
            }
        }
    }

    /// The README's table of the API lists exactly the documented
    /// operations (path parameters compared by position, not name).
    #[test]
    fn the_readme_lists_exactly_the_documented_operations() {
        let shape = |path: &str| -> String {
            path.split('/')
                .map(|seg| if seg.starts_with('{') { "{}" } else { seg })
                .collect::<Vec<_>>()
                .join("/")
        };
        let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
        let section = readme
            .split("## HTTP API (v1)")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("the README's API section");
        let mut listed = BTreeSet::new();
        for row in section.lines().filter(|l| l.starts_with("| `")) {
            let first_cell = row.split(" | ").next().unwrap_or_default();
            for quoted in first_cell.split('`').skip(1).step_by(2) {
                let mut words = quoted.split_whitespace();
                if let (Some(method), Some(path)) = (words.next(), words.next()) {
                    if ["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method) {
                        let path = path.split('?').next().unwrap_or_default();
                        listed.insert((method.to_string(), shape(path)));
                    }
                }
            }
        }
        let doc = serde_json::to_value(document()).expect("document as JSON");
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                documented.insert((method.to_ascii_uppercase(), shape(path)));
            }
        }
        let missing: Vec<_> = documented.difference(&listed).collect();
        let extra: Vec<_> = listed.difference(&documented).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "documented but not in the README's table: {missing:?}; in the table but not documented: {extra:?}"
        );
    }

    /// The README names every kind of event a Run records, and no other.
    #[test]
    fn the_readme_names_every_event_kind() {
        let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
        let list = readme
            .split("Event types:")
            .nth(1)
            .and_then(|s| s.split("\n\n").next())
            .expect("the README's list of event types");
        let named: BTreeSet<String> = list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        let kinds: BTreeSet<String> = armada_domain::run::ALL_EVENTS
            .iter()
            .map(|k| k.as_str().to_string())
            .collect();
        assert_eq!(named, kinds);
    }
}
