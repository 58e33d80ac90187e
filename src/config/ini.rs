//! pgbouncer.ini syntax: sections, `key = value`, `;`/`#` comments at line start, `%include`.
