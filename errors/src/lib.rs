//! Errors as the project's command-line tools print them, in kubectl's
//! style: one line, each cause said once, and no "(os error N)". Libraries
//! often format their source into their own message (kube does), so `{e:#}`
//! would repeat a kubeconfig's I/O error three times, and the errno only
//! repeats the description beside it.

#![forbid(unsafe_code)]

/// `e` and its causes on one line, joined by ": "; a cause whose text is
/// already part of the line is left out.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = without_os_errors(&cause.to_string());
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// `text` without its " (os error N)" parts.
pub fn without_os_errors(text: &str) -> String {
    const MARK: &str = " (os error ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let tail = &rest[at + MARK.len()..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && tail[digits..].starts_with(')') {
            out.push_str(&rest[..at]);
            rest = &tail[digits + 1..];
        } else {
            out.push_str(&rest[..at + 1]);
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_once_and_no_errno() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let io_text = io.to_string();
        let e = anyhow::Error::new(io)
            .context(format!("reading /k/config: {io_text}"))
            .context("loading the kubeconfig");
        assert_eq!(
            one_line(&e),
            format!("loading the kubeconfig: reading /k/config: {io_text}")
        );
        let real = std::fs::read("/nonexistent/aip-errors").unwrap_err();
        let e = anyhow::Error::new(real).context("cannot read /nonexistent/aip-errors");
        assert_eq!(
            one_line(&e),
            "cannot read /nonexistent/aip-errors: No such file or directory"
        );
    }

    #[test]
    fn only_a_well_formed_errno_goes() {
        assert_eq!(without_os_errors("a (os error 2) b"), "a b");
        assert_eq!(without_os_errors("a (os error x) b"), "a (os error x) b");
        assert_eq!(without_os_errors("a (os error 13)"), "a");
        assert_eq!(without_os_errors("(os error 2)"), "(os error 2)");
    }
}
