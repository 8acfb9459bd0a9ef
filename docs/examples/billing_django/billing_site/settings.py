"""The billing example's Django settings: fencekit's app and the billing app, one database."""

SECRET_KEY = "billing-example"  # noqa: S105  # an example's key, never deployed
USE_TZ = True
INSTALLED_APPS = ["fencekit.django", "billing"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "billing",
        "USER": "billing",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
