package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sudoOptions are the options of sudo's command line this sudo takes.
type sudoOptions struct {
	req     sudoRequest
	version bool
	list    bool
	check   bool // -v: validate (nothing to do without passwords)
}

// parseSudoArgs reads sudo's command line: -n, -u USER, -E, -H, -i, -s,
// -k, -v, -l, -V, and "--"; any other option is an error naming it, never
// ignored.
func parseSudoArgs(args []string) (sudoOptions, error) {
	var o sudoOptions
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			o.req.Argv = args[i+1:]
			return o, nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			o.req.Argv = args[i:]
			return o, nil
		}
		if v, ok := strings.CutPrefix(a, "--user="); ok {
			o.req.User = v
			continue
		}
		switch a {
		case "--non-interactive", "--reset-timestamp", "--remove-timestamp", "--set-home":
			continue
		case "--preserve-env":
			o.req.PreserveEnv = true
			continue
		case "--login":
			o.req.Login = true
			continue
		case "--shell":
			o.req.Shell = true
			continue
		case "--user":
			if i+1 == len(args) {
				return o, fmt.Errorf("option %s requires an argument", a)
			}
			i++
			o.req.User = args[i]
			continue
		case "--version":
			o.version = true
			continue
		case "--list":
			o.list = true
			continue
		case "--validate":
			o.check = true
			continue
		}
		if strings.HasPrefix(a, "--") {
			return o, fmt.Errorf("option %s is not supported by this sandbox's sudo", a)
		}
		// A group of short options, -u taking the rest or the next word.
		for j := 1; j < len(a); j++ {
			switch c := a[j]; c {
			case 'n', 'k', 'K', 'H', 'S':
			case 'E':
				o.req.PreserveEnv = true
			case 'i':
				o.req.Login = true
			case 's':
				o.req.Shell = true
			case 'V':
				o.version = true
			case 'l':
				o.list = true
			case 'v':
				o.check = true
			case 'u':
				switch {
				case j+1 < len(a):
					o.req.User = a[j+1:]
				case i+1 < len(args):
					i++
					o.req.User = args[i]
				default:
					return o, fmt.Errorf("option -u requires an argument")
				}
				j = len(a)
			default:
				return o, fmt.Errorf("option -%c is not supported by this sandbox's sudo", c)
			}
		}
	}
	return o, nil
}

// SudoMain is the agent binary run as sudo (mounted over /usr/bin/sudo on
// gVisor): it has the agent run args' command (ServeSudo) on its own
// standard streams and exits with the command's status.
func SudoMain(args []string) int {
	o, err := parseSudoArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\nusage: sudo [-nEHiks] [-u user] [--] command [args...]\n", err)
		return 1
	}
	switch {
	case o.version:
		fmt.Println("sudo (sandboxd: the guest agent runs the command for the image's sudoers; gVisor honours no setuid bit)")
		return 0
	case o.check:
		return 0
	case o.list:
		fmt.Println("User may run the commands the image's sudoers grant without a password: (ALL : ALL) NOPASSWD: ALL")
		return 0
	case len(o.req.Argv) == 0 && !o.req.Login && !o.req.Shell:
		fmt.Fprintln(os.Stderr, "usage: sudo [-nEHiks] [-u user] [--] command [args...]")
		return 1
	}
	o.req.Env = os.Environ()
	if wd, err := os.Getwd(); err == nil {
		o.req.Cwd = wd
	}
	code, err := runSudo(SudoSocket, o.req, [3]int{0, 1, 2})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	return code
}

// runSudo sends req with the streams fds (stdin, stdout, stderr) to the
// agent at socket, passes the signals this process gets on, and answers
// the command's exit status.
func runSudo(socket string, req sudoRequest, fds [3]int) (int, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return 0, fmt.Errorf("the sandbox's agent does not answer (%w)", err)
	}
	defer c.Close()
	line, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	// The streams go with the request's first bytes; one sendmsg on a
	// stream socket may send part of a long request, the rest follows.
	msg := append(line, '\n')
	n, _, err := c.WriteMsgUnix(msg, unix.UnixRights(fds[:]...), nil)
	if err == nil && n < len(msg) {
		_, err = c.Write(msg[n:])
	}
	if err != nil {
		return 0, fmt.Errorf("send the request: %w", err)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	enc := json.NewEncoder(c)
	go func() {
		for s := range sigs {
			if n, ok := s.(syscall.Signal); ok {
				_ = enc.Encode(sudoMessage{Signal: int(n)})
			}
		}
	}()
	var m sudoMessage
	if err := json.NewDecoder(c).Decode(&m); err != nil {
		if err == io.EOF {
			return 0, fmt.Errorf("the sandbox's agent ended the command without its status")
		}
		return 0, err
	}
	if m.Error != "" {
		return 0, fmt.Errorf("%s", m.Error)
	}
	if m.Exit == nil {
		return 0, fmt.Errorf("the sandbox's agent answered no status")
	}
	return *m.Exit, nil
}
