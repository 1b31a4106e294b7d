#!/usr/bin/env bash
# Start an sshd for multi-node horovodrun/mpirun inside the container, as the non-root user,
# on a port above 1024 (default 2222), with host keys kept in ~/.sshd. Mount the cluster's
# shared key pair at ~/.ssh (id_ed25519 + authorized_keys) in every container.
#   docker run -d --network host -v $PWD/cluster-ssh:/home/trainer/.ssh hvd_cifar docker/sshd.sh 2222
set -euo pipefail
port="${1:-2222}"
dir="$HOME/.sshd"
mkdir -p "$dir"
[ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$dir/host_ed25519"
cat > "$dir/sshd_config" <<CONF
Port $port
HostKey $dir/host_ed25519
PidFile $dir/sshd.pid
AuthorizedKeysFile $HOME/.ssh/authorized_keys
PasswordAuthentication no
UsePAM no
StrictModes no
# horovodrun and mpirun pass the job's environment on the command line, not via SendEnv.
PermitUserEnvironment no
CONF
exec /usr/sbin/sshd -D -e -f "$dir/sshd_config"
