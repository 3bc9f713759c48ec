-- Settings Herald keeps in the database: the encryption key's check value.
CREATE TABLE herald_settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);
