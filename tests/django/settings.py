"""The test project's settings (tests/django/conftest.py points the database at the test
server before any test connects)."""

SECRET_KEY = "fencekit-tests"  # noqa: S105  # a test project's key, never deployed
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["fencekit.django", "tests.django.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "fk_django",
        "HOST": "127.0.0.1",  # replaced by the conftest with the test server's
        "PORT": "5432",
        "USER": "postgres",
        "CONN_MAX_AGE": 0,
    },
    # The same database through Django's psycopg connection pool (one connection, reused).
    "pooled": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "fk_django",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "USER": "postgres",
        "CONN_MAX_AGE": 0,
        "OPTIONS": {"pool": {"min_size": 1, "max_size": 1}},
        "TEST": {"MIRROR": "default"},
    },
}
ROOT_URLCONF = "tests.django.shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ALLOWED_HOSTS = ["testserver"]
MIDDLEWARE: list[str] = []
