#!/bin/sh
# As the official image does: the default user from the environment, then the server as rabbitmq.
set -eu
if [ "$1" = rabbitmq-server ]; then
  umask 077
  {
    echo "loopback_users = none"
    [ -n "${RABBITMQ_DEFAULT_USER:-}" ] && echo "default_user = $RABBITMQ_DEFAULT_USER"
    [ -n "${RABBITMQ_DEFAULT_PASS:-}" ] && echo "default_pass = $RABBITMQ_DEFAULT_PASS"
    [ -n "${RABBITMQ_DEFAULT_VHOST:-}" ] && echo "default_vhost = $RABBITMQ_DEFAULT_VHOST"
  } >/etc/rabbitmq/conf.d/10-defaults.conf
  chown rabbitmq:rabbitmq /etc/rabbitmq/conf.d/10-defaults.conf
  chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
  unset RABBITMQ_DEFAULT_USER RABBITMQ_DEFAULT_PASS RABBITMQ_DEFAULT_VHOST
  shift
  exec setpriv --reuid rabbitmq --regid rabbitmq --init-groups \
    env HOME=/var/lib/rabbitmq RABBITMQ_LOGS=- /usr/lib/rabbitmq/bin/rabbitmq-server "$@"
fi
exec "$@"
