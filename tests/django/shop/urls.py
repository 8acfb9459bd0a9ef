from django.urls import path

from . import views

urlpatterns = [path("bump/<int:account_id>/<int:token>", views.bump)]
