# An alembic environment wired for fencekit: fence operations, autogenerate of fences, filters.

[alembic]
# Path to the migration scripts, relative to %(here)s (the directory of this file).
script_location = ${script_location}

# Prepended to sys.path, so that target_metadata below can import your package.
prepend_sys_path = .
path_separator = os

# The MetaData that autogenerate compares with the database, as "package.module:attribute"
# (e.g. myapp.models:Base.metadata). Leave empty to set target_metadata in env.py instead.
target_metadata =

# Compare every schema of the database, not only the default one (alembic's include_schemas).
# The fencekit schema itself is always skipped.
include_schemas = false

# How long a migration waits for a table lock before failing (SET lock_timeout), so that
# fencing a busy table never queues the application's traffic behind it. Empty: wait forever.
lock_timeout = 5s
# The application's roles that take leases from fencekit's issuer (space-separated):
# autogenerate writes op.grant_fencekit_writer("role") for each one not yet a member.
fencekit_writer_roles =

# The database. The DATABASE_URL environment variable, when set, takes precedence.
# Use the psycopg 3 driver: postgresql+psycopg://user:password@host/dbname
sqlalchemy.url = postgresql+psycopg://user:password@localhost/dbname

[post_write_hooks]

[loggers]
keys = root,sqlalchemy,alembic

[handlers]
keys = console

[formatters]
keys = generic

[logger_root]
level = WARNING
handlers = console
qualname =

[logger_sqlalchemy]
level = WARNING
handlers =
qualname = sqlalchemy.engine

[logger_alembic]
level = INFO
handlers =
qualname = alembic

[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic

[formatter_generic]
format = %(levelname)-5.5s [%(name)s] %(message)s
datefmt = %H:%M:%S
