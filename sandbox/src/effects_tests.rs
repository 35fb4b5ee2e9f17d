#![allow(clippy::unwrap_used)]

use super::*;

fn base(name: &str) -> PathBuf {
    let b = std::env::temp_dir().join(format!("armada-effects-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&b);
    std::fs::create_dir_all(b.join("upper")).unwrap();
    std::fs::create_dir_all(b.join("lower")).unwrap();
    b
}

/// An overlay's whiteout: a character device 0/0 (mknod needs root,
/// which the overlay needs too).
fn whiteout(p: &Path) -> bool {
    std::process::Command::new("mknod")
        .arg(p)
        .args(["c", "0", "0"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn additions_are_not_effects_and_deletions_and_rewrites_are() {
    let b = base("judge");
    let (upper, lower) = (b.join("upper"), b.join("lower"));
    std::fs::create_dir_all(lower.join("build/sub")).unwrap();
    std::fs::write(lower.join("build/sub/a.o"), "12345").unwrap();
    std::fs::write(lower.join("notes.txt"), "old").unwrap();
    std::fs::write(lower.join("same.txt"), "same").unwrap();
    std::fs::write(lower.join("log"), "line 1\n").unwrap();
    // Made by the call: a new tree, a rewritten file, a file copied up
    // unchanged.
    std::fs::create_dir_all(upper.join("new/deep")).unwrap();
    std::fs::write(upper.join("new/deep/f"), "n").unwrap();
    std::fs::write(upper.join("notes.txt"), "new!").unwrap();
    std::fs::copy(lower.join("same.txt"), upper.join("same.txt")).unwrap();
    std::fs::copy(lower.join("log"), upper.join("log")).unwrap();
    std::fs::write(upper.join("log"), "line 1\nline 2\n").unwrap();
    let set = judge(&upper, &lower).unwrap();
    assert_eq!(
        set.effects,
        vec![Effect::Changed {
            path: "notes.txt".into(),
            before: 3,
            after: 4
        }]
    );
    assert_eq!(
        set.entries,
        vec![
            PathBuf::from("log"),
            "new".into(),
            "new/deep".into(),
            "new/deep/f".into(),
            "notes.txt".into(),
            "same.txt".into()
        ]
    );
    if whiteout(&upper.join("build")) {
        let set = judge(&upper, &lower).unwrap();
        assert_eq!(set.removed, vec![PathBuf::from("build")]);
        assert!(set.effects.contains(&Effect::Deleted {
            path: "build".into(),
            files: 1,
            bytes: 5
        }));
        assert!(
            set.describe().contains("deletes build (5 bytes)"),
            "{}",
            set.describe()
        );
        // Applied, the deletion and the additions land in the lower tree.
        apply(&upper, &lower, &set).unwrap();
        assert!(!lower.join("build").exists());
        assert_eq!(
            std::fs::read_to_string(lower.join("notes.txt")).unwrap(),
            "new!"
        );
        assert_eq!(
            std::fs::read_to_string(lower.join("new/deep/f")).unwrap(),
            "n"
        );
    }
    std::fs::remove_dir_all(&b).unwrap();
}

#[test]
fn an_approver_reads_escaped_paths_and_a_bounded_list() {
    let set = ChangeSet {
        removed: vec![],
        entries: vec![],
        effects: (0..25)
            .map(|i| Effect::Deleted {
                path: format!("f{i}\nforged line").into(),
                files: 1,
                bytes: 1,
            })
            .collect(),
    };
    let text = set.describe();
    assert!(!text.contains('\n'), "{text}");
    assert!(text.contains("f0\\nforged line"), "{text}");
    assert!(text.ends_with("and 5 more"), "{text}");
}

#[test]
fn held_keys_tell_apart_ids_that_read_alike() {
    assert_ne!(held_key("run", "a.b"), held_key("run", "a_b"));
    assert_eq!(held_key("run", "a.b"), held_key("run", "a.b"));
    assert!(!held_key("r/../x", "c").contains('/'));
}
