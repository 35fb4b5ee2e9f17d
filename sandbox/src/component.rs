//! Ids as path components: what the scratch directories and the saved
//! changes of a call are named by (a leaf: it imports nothing of ours).

/// Keeps an id usable as one path component.
pub fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
