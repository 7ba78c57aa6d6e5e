//! Keys <-> file names: tensordict's robust key encoding, the names Windows refuses, legacy
//! (unencoded) names, leaf file names.

use super::meta::LEAF_SUFFIX;

/// Encodes a key into one safe file-name component, a sub-directory's name: tensordict's
/// robust keys (`portable_key`), exactly, except on Windows, where the names Windows refuses
/// are escaped too (see `windows_safe_name`).
pub fn encode_key(key: &str) -> String {
    on_this_system(portable_key(key))
}

fn on_this_system(name: String) -> String {
    if cfg!(windows) {
        windows_safe_name(name)
    } else {
        name
    }
}

/// A file name as the file system compares it: as is, except on Windows, whose file names are
/// case-insensitive (there `A.memmap` and `a.memmap` are one file).
pub fn fold_case(name: &str) -> String {
    if cfg!(windows) {
        name.to_lowercase()
    } else {
        name.to_string()
    }
}

/// True for a name whose part before the first dot is a Windows device name (`CON`, `PRN`,
/// `AUX`, `NUL`, `COM0`-`COM9`, `LPT0`-`LPT9`, superscript digits too, any case).
fn is_device_name(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or("").to_ascii_uppercase();
    matches!(stem.as_str(), "CON" | "PRN" | "AUX" | "NUL")
        || (stem.len() >= 4
            && (stem.starts_with("COM") || stem.starts_with("LPT"))
            && stem[3..].chars().count() == 1
            && stem[3..]
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '¹' | '²' | '³')))
}

/// Windows' reserved names kept out of a file name (applied to the whole name, a leaf's suffix
/// included), decoding to the same key: a device name (`is_device_name`, with any extension)
/// gets its first letter as `%XX`, and a trailing dot becomes `%2E` (Windows drops it; a
/// trailing space is already `%20`, a `:` already `%3A`). Linux keeps tensordict's names, so
/// directories with such keys written on one system are not found on the other.
pub fn windows_safe_name(mut name: String) -> String {
    if is_device_name(&name) {
        name = format!("%{:02X}{}", name.as_bytes()[0], &name[1..]);
    }
    if name.ends_with('.') {
        name.pop();
        name.push_str("%2E");
    }
    name
}

/// Encodes a key exactly like tensordict's robust keys: `/ < > : " | ? * \ space NUL %`,
/// control characters and DEL become `%XX`; `""`, `.` and `..` become `%`, `%2E` and `%2E%2E`.
/// The names inside archives, on every system.
pub fn portable_key(key: &str) -> String {
    match key {
        "" => return "%".to_string(),
        "." => return "%2E".to_string(),
        ".." => return "%2E%2E".to_string(),
        _ => {}
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        let escape = matches!(
            c,
            '/' | '<' | '>' | ':' | '"' | '|' | '?' | '*' | '\\' | ' ' | '%'
        ) || (c as u32) < 32
            || c as u32 == 127;
        if escape {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The raw key as a legacy (unencoded) file-name component, if that is safe to open.
pub fn legacy_name(key: &str) -> Option<&str> {
    let unsafe_name = key.is_empty()
        || key == "."
        || key == ".."
        || key.contains(['/', '\\', '\0'])
        || key.as_bytes().get(1) == Some(&b':')
        // Windows: a device (`CON.memmap` opens the console) or an alternate data stream.
        || (cfg!(windows) && (is_device_name(key) || key.contains(':')));
    (!unsafe_name).then_some(key)
}

/// File name of a leaf (on Windows, `windows_safe_name` of the whole name).
pub fn leaf_file(key: &str) -> String {
    on_this_system(portable_leaf_file(key))
}

/// Name of a leaf's file inside an archive (tensordict's, on every system).
pub fn portable_leaf_file(key: &str) -> String {
    let mut name = portable_key(key);
    name.push_str(LEAF_SUFFIX);
    name
}

/// The name of a nested leaf's table of component shapes, beside its data file `name`
/// (`key.memmap` -> `key.shape.memmap`, as the reference's `with_suffix` makes it).
pub fn shape_file(name: &str) -> String {
    let stem = name.strip_suffix(super::meta::LEAF_SUFFIX).unwrap_or(name);
    format!("{stem}{}", super::meta::SHAPE_SUFFIX)
}

#[cfg(test)]
mod tests;
