//! The log format of the process (`--log-format`, `log_format` in the config file,
//! `LMPERF_LOG_FORMAT`): resolved before the rest of the configuration, since logging starts
//! first (so that the configuration's own warnings are logged in the chosen format).

use std::path::Path;

use super::ConfigError;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (tracing-subscriber's default format).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the event's fields, and
    /// `trace_id`/`span_id` on lines about a request or a diagnosis (what Loki, Fluent Bit
    /// and the Collector's filelog receiver parse without configuration).
    Json,
}

/// The values `--log-format` and `log_format` accept.
pub const LOG_FORMATS: [&str; 2] = ["text", "json"];

impl LogFormat {
    /// Parses `text` or `json`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field` and the value.
    pub fn parse(field: &str, value: &str) -> Result<Self, ConfigError> {
        match value {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(ConfigError::invalid(field, other, "one of text, json")),
        }
    }
}

/// The log format: the flag, else the config file's `log_format`, else `LMPERF_LOG_FORMAT`,
/// else text. A config file that cannot be read or parsed counts as not setting it (loading
/// the configuration reports that error).
///
/// # Errors
/// A value other than `text` or `json`, naming where it came from.
pub fn resolve(
    flag: Option<&str>,
    config_file: Option<&Path>,
    env: &dyn super::Env,
) -> Result<LogFormat, ConfigError> {
    if let Some(v) = flag {
        return LogFormat::parse("--log-format", v);
    }
    if let Some(v) = config_file
        .and_then(|p| super::parse_file(p).ok())
        .and_then(|raw| raw.log_format)
    {
        return LogFormat::parse("log_format", &v);
    }
    match env.var("LMPERF_LOG_FORMAT") {
        Some(v) => LogFormat::parse("LMPERF_LOG_FORMAT", &v),
        None => Ok(LogFormat::Text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Vars(HashMap<&'static str, &'static str>);
    impl super::super::Env for Vars {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|v| (*v).to_owned())
        }
    }

    #[test]
    fn flag_over_file_over_env() {
        let dir = std::env::temp_dir().join(format!("lmperf-logfmt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.toml");
        std::fs::write(&file, "log_format = \"json\"\n").unwrap();
        let env = Vars(HashMap::from([("LMPERF_LOG_FORMAT", "text")]));
        let none = Vars(HashMap::new());
        assert_eq!(
            resolve(Some("text"), Some(&file), &env).unwrap(),
            LogFormat::Text
        );
        assert_eq!(resolve(None, Some(&file), &env).unwrap(), LogFormat::Json);
        assert_eq!(resolve(None, None, &env).unwrap(), LogFormat::Text);
        assert_eq!(resolve(None, None, &none).unwrap(), LogFormat::Text);
        let env_json = Vars(HashMap::from([("LMPERF_LOG_FORMAT", "json")]));
        assert_eq!(resolve(None, None, &env_json).unwrap(), LogFormat::Json);
        std::fs::write(&file, "log_format = \"xml\"\n").unwrap();
        assert_eq!(
            resolve(None, Some(&file), &none).unwrap_err().to_string(),
            "log_format = \"xml\": one of text, json"
        );
        assert_eq!(
            resolve(Some("yaml"), None, &none).unwrap_err().to_string(),
            "--log-format = \"yaml\": one of text, json"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
