//! Naming the key a TOML parse error points at.

/// The key path (`listeners[1].port`) of the `key = value` line holding byte
/// `at` of a TOML text, from the table headers above it. Only for naming a field
/// in an error: plain `key = value` lines under `[table]`/`[[array]]` headers,
/// which is how the example configurations are written.
pub(super) fn key_path_at(text: &str, at: usize) -> Option<String> {
    let mut table = String::new();
    // Entries seen per array-of-tables path, e.g. "subsystems[0].namespaces" -> 2.
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let l = line.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            // `[[a.b]]` is an entry of `b` inside the latest `a`.
            let (parent, leaf) = match name.trim().rsplit_once('.') {
                Some((p, leaf)) => (resolve(&counts, p.trim()), leaf.trim()),
                None => (String::new(), name.trim()),
            };
            let path = if parent.is_empty() {
                leaf.to_string()
            } else {
                format!("{parent}.{leaf}")
            };
            let n = match counts.iter_mut().find(|(p, _)| *p == path) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    counts.push((path.clone(), 1));
                    1
                }
            };
            table = format!("{path}[{}]", n - 1);
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = resolve(&counts, name.trim());
        } else if at < offset && at >= start {
            let key = l.split_once('=')?.0.trim();
            if key.is_empty() || key.starts_with('#') {
                return None;
            }
            return Some(if table.is_empty() {
                key.to_string()
            } else {
                format!("{table}.{key}")
            });
        }
        if at < offset {
            return None;
        }
    }
    None
}

/// `subsystems.namespaces` with the latest entry of each array it passes
/// through: `subsystems[1].namespaces[0]`.
fn resolve(counts: &[(String, usize)], dotted: &str) -> String {
    let mut path = String::new();
    for part in dotted.split('.') {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part.trim());
        if let Some((_, n)) = counts.iter().find(|(p, _)| *p == path) {
            path = format!("{path}[{}]", n - 1);
        }
    }
    path
}
