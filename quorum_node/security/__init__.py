"""Security of a node: TLS contexts that follow their files, credentials (certificate principals
and bearer tokens), roles, and the authorization of every HTTP route. See docs/security.md."""
