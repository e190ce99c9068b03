package admission_test

import "computeplane/computeclient"

func withToken(token string) computeclient.Option { return computeclient.WithToken(token) }

func asAPI(err error) (*computeclient.Error, bool) {
	if err == nil {
		return nil, false
	}
	return computeclient.AsError(err)
}
