from django.db import models


class Payment(models.Model):
    account = models.CharField(max_length=50)
    amount = models.IntegerField()

    class Meta:
        app_label = "django_site"
