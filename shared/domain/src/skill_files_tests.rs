use super::*;

/// A tar of `members` (name, kind, content), names written raw so that a
/// bad one can be made.
fn tar_of(members: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, content) in members {
        let mut h = tar::Header::new_ustar();
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        if *kind == tar::EntryType::Symlink {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        b.append(&h, *content).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn a_tar_of_files_and_directories_is_taken_and_named_by_its_digest() {
    let tar = tar_of(&[
        ("tool/", tar::EntryType::Directory, b""),
        ("tool/main.py", tar::EntryType::Regular, b"print(1)\n"),
        ("README", tar::EntryType::Regular, b"hi"),
    ]);
    let judged = judge_upload(&tar).unwrap();
    assert_eq!(judged.files.files, 2);
    assert_eq!(judged.files.bytes, tar.len() as u64);
    assert_eq!(judged.files.sha256, hex::encode(Sha256::digest(&tar)));
    // A gzip of it is stored as the same tar, under the same digest.
    let unzipped = judge_upload(&gzip(&tar)).unwrap();
    assert_eq!(unzipped.tar, tar);
    assert_eq!(unzipped.files, judged.files);
}

#[test]
fn names_out_of_the_directory_links_and_devices_are_refused_by_name() {
    for (name, kind, why) in [
        ("../escape", tar::EntryType::Regular, "'..'"),
        ("a/../../b", tar::EntryType::Regular, "'..'"),
        ("/etc/cron.d/x", tar::EntryType::Regular, "absolute"),
        ("link", tar::EntryType::Symlink, "Symlink"),
        ("dev", tar::EntryType::Char, "Char"),
        ("fifo", tar::EntryType::Fifo, "Fifo"),
    ] {
        let tar = tar_of(&[("ok.txt", tar::EntryType::Regular, b"x"), (name, kind, b"")]);
        let e = judge_upload(&tar).unwrap_err();
        assert_eq!(e.code, "INVALID_ARCHIVE", "{name}");
        assert!(
            e.message.contains(name) && e.message.contains(why),
            "{name}: {e}"
        );
    }
}

#[test]
fn what_is_not_a_tar_or_is_too_large_is_refused() {
    assert_eq!(
        judge_upload(b"not a tar").unwrap_err().code,
        "INVALID_ARCHIVE"
    );
    assert_eq!(
        judge_upload(&gzip(b"neither")).unwrap_err().code,
        "INVALID_ARCHIVE"
    );
    assert_eq!(
        judge_upload(&vec![0u8; MAX_UPLOAD_BYTES + 1])
            .unwrap_err()
            .code,
        "PAYLOAD_TOO_LARGE"
    );
    // A small gzip that unpacks past the bound (zeros compress well).
    let bomb = gzip(&vec![0u8; MAX_UNPACKED_BYTES as usize + 1024]);
    assert!(bomb.len() < MAX_UPLOAD_BYTES);
    assert_eq!(judge_upload(&bomb).unwrap_err().code, "PAYLOAD_TOO_LARGE");
}

#[test]
fn the_stage_mark_changes_with_the_files_or_the_install_steps() {
    let steps = vec!["npm ci".to_string()];
    let a = stage_mark(Some("abc"), &steps);
    assert_eq!(a, stage_mark(Some("abc"), &steps));
    assert_ne!(a, stage_mark(Some("abd"), &steps));
    assert_ne!(a, stage_mark(Some("abc"), &[]));
    assert_ne!(stage_mark(None, &steps), a);
    // Steps are delimited: ["ab", "c"] is not ["a", "bc"].
    let split = |s: &[&str]| stage_mark(None, &s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
    assert_ne!(split(&["ab", "c"]), split(&["a", "bc"]));
}
