//! Server-sent events framing (the WHATWG event-stream format), fed bytes as
//! they arrive.

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    pub id: Option<String>,
    pub data: String,
    pub retry_ms: Option<u64>,
}

#[derive(Debug, Default)]
pub struct Parser {
    buffer: Vec<u8>,
    data: Vec<String>,
    id: Option<String>,
    retry_ms: Option<u64>,
    has_fields: bool,
}

impl Parser {
    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n' || b == b'\r') {
            // A CR immediately followed by LF is one line break.
            let skip = if self.buffer[end] == b'\r' && self.buffer.get(end + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            if self.buffer[end] == b'\r' && end + 1 == self.buffer.len() {
                break; // wait: the LF may be in the next chunk
            }
            let line: Vec<u8> = self.buffer.drain(..end + skip).take(end).collect();
            if let Some(event) = self.line(&String::from_utf8_lossy(&line)) {
                events.push(event);
            }
        }
        events
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            if !self.has_fields {
                return None;
            }
            self.has_fields = false;
            let event = Event {
                id: self.id.clone(),
                data: std::mem::take(&mut self.data).join("\n"),
                retry_ms: self.retry_ms.take(),
            };
            return Some(event);
        }
        if line.starts_with(':') {
            return None; // comment
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        self.has_fields = true;
        match field {
            "data" => self.data.push(value.to_owned()),
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            "retry" => self.retry_ms = value.parse().ok(),
            _ => {}
        }
        None
    }

    /// Bytes held for the event not yet complete: a peer that never ends
    /// an event must not grow this without bound.
    pub fn pending_bytes(&self) -> usize {
        self.buffer.len() + self.data.iter().map(String::len).sum::<usize>()
    }

    /// The last event id seen (it persists across events, as the spec says).
    pub fn last_id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_across_chunks_and_line_endings() {
        let mut p = Parser::default();
        assert!(p.push(b"id: 7\r").is_empty());
        let events = p.push(b"\nretry: 500\ndata: \n\n: comment\ndata: {\"a\":\ndata: 1}\r\n\r\n");
        assert_eq!(
            events,
            vec![
                Event {
                    id: Some("7".into()),
                    data: String::new(),
                    retry_ms: Some(500)
                },
                Event {
                    id: Some("7".into()),
                    data: "{\"a\":\n1}".into(),
                    retry_ms: None
                },
            ]
        );
        assert_eq!(p.last_id(), Some("7"));
    }
}
