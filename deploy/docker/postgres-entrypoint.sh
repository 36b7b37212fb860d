# A fresh cluster on first start (trust auth inside the compose network only, never published
# beyond localhost), then the server in the foreground.
set -eu
PGDATA=/var/lib/postgresql/data
BIN=/usr/lib/postgresql/15/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  "$BIN/initdb" -D "$PGDATA" -U hangar --auth=trust >/dev/null
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  echo "host all all 0.0.0.0/0 trust" >> "$PGDATA/pg_hba.conf"
  "$BIN/pg_ctl" -D "$PGDATA" -w start >/dev/null
  "$BIN/createdb" -U hangar dagster
  "$BIN/createdb" -U hangar lake
  "$BIN/pg_ctl" -D "$PGDATA" -w stop >/dev/null
fi
exec "$BIN/postgres" -D "$PGDATA"
